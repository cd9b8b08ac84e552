package ledger_test

import (
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// countingBook counts the rows a command reads from a store-like book.
type countingBook struct {
	*storeBook
	reads int
}

func (c *countingBook) Policy(g uint64) (*ledger.Policy, bool) {
	c.reads++
	return c.storeBook.Policy(g)
}
func (c *countingBook) PolicyHead(k ledger.PolicyKey) (*ledger.PolicyHead, bool) {
	c.reads++
	return c.storeBook.PolicyHead(k)
}
func (c *countingBook) Account(k ledger.AccountKey) (*ledger.Account, bool) {
	c.reads++
	return c.storeBook.Account(k)
}
func (c *countingBook) AccountCurrent(k ledger.PolicyKey) (uint64, bool) {
	c.reads++
	return c.storeBook.AccountCurrent(k)
}
func (c *countingBook) Reservation(id string) (*ledger.Reservation, bool) {
	c.reads++
	return c.storeBook.Reservation(id)
}
func (c *countingBook) Move(id string) (*ledger.Move, bool) { c.reads++; return c.storeBook.Move(id) }

// A subject's owing set is Meta rows (ledger/owing.go), which the hot path
// must not read: they count. (Other Meta rows do not: the figures below
// were measured without them, and a shard issuance reads its gateway's
// fence and the fence floor.)
func (c *countingBook) Meta(name string) int64 {
	if strings.HasPrefix(name, ledger.MetaOwingPrefix) {
		c.reads++
	}
	return c.storeBook.Meta(name)
}
func (c *countingBook) Shard(id string) (*ledger.Shard, bool) {
	c.reads++
	return c.storeBook.Shard(id)
}

// readsOf returns how many rows cmd reads, applied at now.
func readsOf(t *testing.T, b *countingBook, cmd ledger.Command, now time.Time) int {
	t.Helper()
	b.reads = 0
	if res := ledger.Apply(b, &cmd, now); res.Err != nil {
		t.Fatalf("%s: %v", cmd.Kind, res.Err)
	}
	return b.reads
}

// The hot path of a subject that owes nothing in a dropped unit (its
// current account is the deciding generation's) reads no more rows than
// before 3cda4eec: Reserve, IssueShard and the Refill worker's Refill of
// the current account. The figures are those of 6cf63943 (the commit
// before), measured with this test.
func TestDroppedDebtHotPathReadsNothingMore(t *testing.T) {
	b := &countingBook{storeBook: newStoreBook()}
	now := t0
	p := emergencyPolicy()
	if res := ledger.Apply(b, &ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}, now); res.Err != nil {
		t.Fatal(res.Err)
	}
	reserve := func(id string) ledger.Command {
		return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{1}}
	}
	readsOf(t, b, reserve("warm"), now) // opens the account
	now = now.Add(2 * time.Second)
	key := ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: 1}
	got := map[string]int{
		"reserve": readsOf(t, b, reserve("r1"), now),
		"shard":   readsOf(t, b, issueCmd("sh-1", "gw-a", 1, 10), now.Add(time.Second)),
		"refill":  readsOf(t, b, ledger.Command{Kind: ledger.KindRefill, Account: key}, now.Add(2*time.Second)),
	}
	t.Logf("reads: %v", got)
	want := map[string]int{"reserve": wantReserveReads, "shard": wantShardReads, "refill": wantRefillReads}
	for k, w := range want {
		if got[k] > w {
			t.Errorf("%s reads %d rows, %d before 3cda4eec", k, got[k], w)
		}
	}
}

const wantReserveReads, wantShardReads, wantRefillReads = 6, 7, 3
