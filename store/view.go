package store

import (
	"context"
	"slices"

	"github.com/capledger/capledger/ledger"
)

// AccountsView is everything a read view (an account, a page of
// accounts, a page of debtors, the standings) needs to show some subject
// keys' accounts as their next commands would find them, read from one
// snapshot of the committed rows (Store.AccountsView): a publish, a
// rollback, a switch or a settle committed meanwhile is in all of it or
// in none of it, so a view never shows a head or a policy beside accounts
// it never stood beside.
type AccountsView struct {
	// Accounts are the subjects' accounts (every generation of each) in
	// key order, as AccountsOfSubjects returns them.
	Accounts []ledger.Account
	// Owing holds, for the subjects one of whose accounts owes debt, the
	// current pointer and owing-set Meta rows (SubjectOwing; a subject
	// with neither is absent). The others' accounts say
	// they are not frozen.
	Owing map[ledger.PolicyKey]SubjectOwing
	// Deciding is the generation deciding for each subject
	// (ledger.DecidingGeneration over the heads of its key and of its
	// route's "*" key); absent: none decides.
	Deciding map[ledger.PolicyKey]uint64
	// Policies holds the policies of the accounts' generations and of
	// each subject's deciding generation, by generation.
	Policies map[uint64]ledger.Policy
}

// ViewReads are the reads a driver makes inside one snapshot for
// ReadAccountsView (each a read of a few statements, whatever the number
// of subjects): the accounts of subject keys, the owing rows of subject
// keys, the heads of policy keys (absent: none), the policies of
// generations (absent: none).
type ViewReads struct {
	Accounts func(keys []ledger.PolicyKey) ([]ledger.Account, error)
	Owing    func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]SubjectOwing, error)
	Heads    func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error)
	Policies func(generations []uint64) (map[uint64]ledger.Policy, error)
	// Between, when not nil, is called between the accounts and the rest
	// in place of BetweenReads (the in-memory store, which reads under
	// its lock, calls BetweenReads after instead).
	Between func()
}

// ReadAccountsView reads the AccountsView of subjects through r, which
// the caller runs inside one snapshot: the accounts first, then (after
// BetweenReads, the tests' hook) the owing rows of the subjects that owe
// in them, the heads deciding for every subject, and the policies of the
// accounts' and deciding generations. A key with an empty Subject names
// no account; none named is an empty view. Which heads decide is
// ledger.DecidingGeneration's rule, here once for every driver.
func ReadAccountsView(ctx context.Context, subjects []ledger.PolicyKey, r ViewReads) (AccountsView, error) {
	view := AccountsView{Owing: map[ledger.PolicyKey]SubjectOwing{}, Deciding: map[ledger.PolicyKey]uint64{},
		Policies: map[uint64]ledger.Policy{}}
	keys := slices.DeleteFunc(slices.Clone(subjects), func(k ledger.PolicyKey) bool { return k.Subject == "" })
	slices.SortFunc(keys, ledger.PolicyKey.Compare)
	keys = slices.Compact(keys)
	if len(keys) == 0 {
		return view, nil
	}
	accounts, err := r.Accounts(keys)
	if err != nil {
		return AccountsView{}, err
	}
	slices.SortFunc(accounts, func(a, b ledger.Account) int { return a.Key.Compare(b.Key) })
	view.Accounts = accounts
	if r.Between != nil {
		r.Between()
	} else {
		BetweenReads(ctx)
	}

	var owes []ledger.PolicyKey
	for i := range accounts {
		subject := accounts[i].Key.SubjectKey()
		if _, debt := accounts[i].Debt(); debt > 0 && (len(owes) == 0 || owes[len(owes)-1] != subject) {
			owes = append(owes, subject) // accounts are in key order
		}
	}
	if len(owes) > 0 {
		if view.Owing, err = r.Owing(owes); err != nil {
			return AccountsView{}, err
		}
	}

	var headKeys []ledger.PolicyKey
	asked := map[ledger.PolicyKey]bool{}
	for _, subject := range keys {
		ledger.DecidingGeneration(subject, func(key ledger.PolicyKey) (uint64, bool) {
			if !asked[key] {
				asked[key] = true
				headKeys = append(headKeys, key)
			}
			return 0, false // every key it may ask
		})
	}
	heads, err := r.Heads(headKeys)
	if err != nil {
		return AccountsView{}, err
	}
	generations := make([]uint64, 0, len(accounts)+len(keys))
	for i := range accounts {
		generations = append(generations, accounts[i].Key.Generation)
	}
	for _, subject := range keys {
		g, ok := ledger.DecidingGeneration(subject, func(key ledger.PolicyKey) (uint64, bool) {
			h, ok := heads[key]
			return h.Active, ok
		})
		if ok {
			view.Deciding[subject] = g
			generations = append(generations, g)
		}
	}
	slices.Sort(generations)
	generations = slices.Compact(generations)
	if view.Policies, err = r.Policies(generations); err != nil {
		return AccountsView{}, err
	}
	return view, nil
}
