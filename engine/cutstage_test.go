package engine

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// TestFileStageRoundTrip: what a cut stages reads back the same, field
// for field and in order (negative and large terms, every dimension,
// empty and non-ASCII strings, routes and regions repeated or not), and
// twice.
func TestFileStageRoundTrip(t *testing.T) {
	st, err := newFileStage(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	var want []ledger.CheckpointAccount
	for i := range 3000 {
		a := ledger.CheckpointAccount{Account: ledger.AccountKey{Subject: fmt.Sprintf("tenant-é%d", i), Route: fmt.Sprintf("r%d", i/1000),
			Region: []string{"", "eu-1"}[i%2], Generation: uint64(i) << (i % 40)}, Entries: int64(i) * 1e9, Journal: fmt.Sprintf("%064x", i)}
		for d := range a.Balances {
			a.Balances[d] = ledger.Balance{Opening: int64(i * d), Minted: -int64(i), OverdraftIssued: 1 << 62, Available: int64(d),
				Reserved: 3, Spent: -1 << 62, RetiredForEmergency: 5, RetiredForMove: 6, OverdraftRepaid: int64(i % 7)}
		}
		if err := st.Put(&a); err != nil {
			t.Fatal(err)
		}
		want = append(want, a)
	}
	for range 2 {
		var got []ledger.CheckpointAccount
		if err := st.Each(func(a *ledger.CheckpointAccount) error { got = append(got, *a); return nil }); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("read back %d accounts, not the %d put", len(got), len(want))
		}
	}
}
