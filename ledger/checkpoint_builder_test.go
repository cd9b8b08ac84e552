package ledger

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"
)

// builderPrev is a sealed checkpoint of n accounts, in key order.
func builderPrev(n int) *Checkpoint {
	c := &Checkpoint{Seq: 1, Through: 10, CutAt: time.Unix(0, 0).UTC(), Accounts: make([]CheckpointAccount, n)}
	for i := range c.Accounts {
		a := &c.Accounts[i]
		a.Account = AccountKey{Subject: fmt.Sprintf("t%07d", i), Route: "r", Region: "x", Generation: 1}
		a.Balances[0] = Balance{Opening: 5, Available: 5}
		a.Entries = 1
		a.Journal = fmt.Sprintf("%064d", i)
		c.Entries++
	}
	c.Seal()
	return c
}

// TestCheckpointBuilderHoldsOnlyTouchedAccounts: building the next
// checkpoint allocates per account touched since the previous one, not
// per account of the previous one (a million accounts once held a hash
// each for the whole audit).
func TestCheckpointBuilderHoldsOnlyTouchedAccounts(t *testing.T) {
	allocs := func(n int) float64 {
		prev := builderPrev(n)
		entries := make([]JournalEntry, 8)
		for i := range entries {
			entries[i] = JournalEntry{Kind: 1, Account: prev.Accounts[i*(n/8)].Account}
			entries[i].Delta[0] = Balance{Available: -1, Spent: 1}
		}
		return testing.AllocsPerRun(5, func() {
			b := newCheckpointBuilder(prev, 20, nil)
			for i := range entries {
				b.add(11, &entries[i])
			}
		})
	}
	small, large := allocs(1_000), allocs(100_000)
	if large > small+4 {
		t.Fatalf("the builder allocates %.0f times over 100,000 previous accounts, %.0f over 1,000: it grows with the untouched accounts", large, small)
	}
}

// TestCheckpointBuilderMergesUntouchedAccounts: the lazily merged
// checkpoint is the one holding every account's replay gives: untouched
// accounts keep their vectors and chain their digest, touched ones add
// their entries, new ones join in key order.
func TestCheckpointBuilderMergesUntouchedAccounts(t *testing.T) {
	prev := builderPrev(5)
	fresh := AccountKey{Subject: "t0000002a", Route: "r", Region: "x", Generation: 1}
	entries := []JournalEntry{{Kind: 1, Account: prev.Accounts[1].Account}, {Kind: 1, Account: fresh}}
	entries[0].Delta[0] = Balance{Available: -2, Spent: 2}
	entries[1].Delta[0] = Balance{Minted: 3, Available: 3}
	b := newCheckpointBuilder(prev, 20, nil)
	for i := range entries {
		b.add(11+int64(i), &entries[i])
	}
	b.add(21, &entries[0]) // beyond the cut
	c := b.finish(time.Unix(1, 0))
	if got := VerifyCheckpoints([]Checkpoint{prev.Header(), *c}); len(got) != 0 {
		t.Fatalf("the chain does not verify: %v", got)
	}
	if len(c.Accounts) != 6 || c.Accounts[3].Account != fresh || c.Entries != prev.Entries+2 {
		t.Fatalf("accounts %+v, entries %d", c.Accounts, c.Entries)
	}
	for i, want := range []int{0, 2, 4, 5} {
		a, p := c.Accounts[want], prev.Accounts[[]int{0, 2, 3, 4}[i]]
		h := sha256.New()
		writeString(h, p.Journal)
		if a.Account != p.Account || a.Balances != p.Balances || a.Entries != p.Entries || a.Journal != digestHex(h) {
			t.Fatalf("untouched account %d: %+v, previous %+v", want, a, p)
		}
	}
	touched := c.Accounts[1]
	h := sha256.New()
	writeString(h, prev.Accounts[1].Journal)
	writeEntry(h, &entries[0])
	if touched.Balances[0] != (Balance{Opening: 5, Available: 3, Spent: 2}) || touched.Entries != 2 || touched.Journal != digestHex(h) {
		t.Fatalf("touched account: %+v", touched)
	}
}
