package engine

import (
	"context"
	"reflect"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// snapshotStore answers AccountsWithOwing with the rows of a later
// snapshot than its other reads', and keeps which subjects it was asked.
type snapshotStore struct {
	store.Store
	asked    [][]ledger.PolicyKey
	accounts []ledger.Account
	owing    map[ledger.PolicyKey]store.SubjectOwing
}

func (s *snapshotStore) AccountsWithOwing(_ context.Context, subjects []ledger.PolicyKey) ([]ledger.Account, map[ledger.PolicyKey]store.SubjectOwing, error) {
	s.asked = append(s.asked, subjects)
	return s.accounts, s.owing, nil
}

// readOwing asks for the subjects that owe only (a subject none of whose
// accounts owes costs no read), and shows each of them from the accounts
// read with its owing rows, in place of those read before: a switch
// committed between the two reads (generation 1's debt moved to
// generation 2's new account, the pointer with it) is shown whole, not
// generation 1's debt beside the pointer at 2. A subject that no longer
// owes in that snapshot keeps no owing rows (shown refilled as its rows
// stand).
func TestReadOwingShowsDebtorsFromTheSnapshotOfTheirOwingRows(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New()
	t.Cleanup(func() { mem.Close() })
	plain := ledger.PolicyKey{Subject: "a", Route: "chat", Region: "eu"}
	debtor := ledger.PolicyKey{Subject: "b", Route: "chat", Region: "eu"}
	var policies []ledger.Policy
	for g := uint64(1); g <= 2; g++ {
		p := ledger.Policy{Key: debtor, Generation: g, Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100, RefillUnits: 1}}}.WithDefaults()
		policies = append(policies, p)
	}
	tx, err := mem.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Policies: policies}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	account := func(k ledger.PolicyKey, g uint64, issued ledger.Units, version uint64) ledger.Account {
		a := ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g}, Dims: 1, Version: version}
		a.Balances[0] = ledger.Balance{Opening: 100, OverdraftIssued: issued, Spent: 100 + issued}
		return a
	}
	before := []ledger.Account{account(plain, 1, 0, 1), account(debtor, 1, 30, 1)}
	moved := []ledger.Account{account(debtor, 1, 0, 2), account(debtor, 2, 30, 1)}
	owing := map[ledger.PolicyKey]store.SubjectOwing{debtor: {Current: 2, HasCurrent: true}}
	st := &snapshotStore{Store: mem, accounts: moved, owing: owing}
	shown, gotOwing, err := readOwing(ctx, st, before, newPolicyReads(st))
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]ledger.PolicyKey{{debtor}}; !reflect.DeepEqual(st.asked, want) {
		t.Errorf("asked %v, want %v", st.asked, want)
	}
	if want := append([]ledger.Account{before[0]}, moved...); !reflect.DeepEqual(shown, want) {
		t.Errorf("shown\n %+v\nwant\n %+v", shown, want)
	}
	if !reflect.DeepEqual(gotOwing, owing) {
		t.Errorf("owing %+v, want %+v", gotOwing, owing)
	}

	// Repaid by the snapshot: its owing rows are not used.
	st = &snapshotStore{Store: mem, accounts: []ledger.Account{account(debtor, 1, 0, 3)},
		owing: map[ledger.PolicyKey]store.SubjectOwing{debtor: {Current: 1, HasCurrent: true}}}
	shown, gotOwing, err = readOwing(ctx, st, before, newPolicyReads(st))
	if err != nil {
		t.Fatal(err)
	}
	if want := []ledger.Account{before[0], st.accounts[0]}; !reflect.DeepEqual(shown, want) || len(gotOwing) != 0 {
		t.Errorf("repaid meanwhile: shown %+v, owing %+v; want %+v and none", shown, gotOwing, want)
	}

	// Nobody owes: no read.
	st = &snapshotStore{Store: mem}
	if shown, _, err := readOwing(ctx, st, before[:1], newPolicyReads(st)); err != nil || len(st.asked) != 0 || !reflect.DeepEqual(shown, before[:1]) {
		t.Errorf("no debtor: shown %+v, %v, asked %v; want the accounts, no read", shown, err, st.asked)
	}
}
