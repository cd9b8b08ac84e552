package memstore_test

import (
	"cmp"
	"context"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/storetest"
)

// brokenEnv names the fault TestBrokenStoreHelper runs the suite with.
const brokenEnv = "CAPLEDGER_STORETEST_BROKEN"

// brokenStore is a memstore with one deliberate fault, for the negative
// control of the conformance suite.
type brokenStore struct {
	store.Store
	fault string
}

func (s brokenStore) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return brokenTx{Tx: tx, fault: s.fault}, nil
}

func (s brokenStore) AccountGet(ctx context.Context, key ledger.AccountKey) (ledger.Account, error) {
	a, err := s.Store.AccountGet(ctx, key)
	if err == nil && s.fault == "account-read" {
		a.Balances[0].Available++
	}
	return a, err
}

func (s brokenStore) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	switch s.fault {
	case "policy-page-inclusive-cursor":
		if f.After > 0 {
			f.After--
		}
	case "policy-page-route-ignored":
		f.Route = ""
	case "policy-page-newest-active":
		// Active taken as the newest generation of its key on the page.
		list, err := s.Store.PolicyPage(ctx, f)
		newest := map[ledger.PolicyKey]uint64{}
		for _, l := range list {
			newest[l.Policy.Key] = max(newest[l.Policy.Key], l.Policy.Generation)
		}
		for i := range list {
			list[i].Active = newest[list[i].Policy.Key] == list[i].Policy.Generation
		}
		return list, err
	case "policy-page-prefix-subject":
		// A subject filter matched as a prefix (a LIKE without escaping).
		all, err := s.Store.PolicyPage(ctx, store.PolicyFilter{Route: f.Route, Region: f.Region, After: f.After, Limit: math.MaxInt32})
		var out []store.ListedPolicy
		for _, p := range all {
			if strings.HasPrefix(p.Policy.Key.Subject, f.Subject) && len(out) < f.Limit {
				out = append(out, p)
			}
		}
		return out, err
	}
	return s.Store.PolicyPage(ctx, f)
}

func (s brokenStore) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error) {
	list, err := s.Store.ReservationsUnknown(ctx, f)
	if err != nil {
		return list, err
	}
	switch s.fault {
	case "unknown-ties-by-id-desc":
		slices.SortStableFunc(list, func(a, b ledger.Reservation) int {
			return cmp.Or(a.UnknownAt.Compare(b.UnknownAt), cmp.Compare(b.ID, a.ID))
		})
	case "unknown-by-start":
		// The order before UnknownAt was recorded: by when the work
		// started, not by when it was marked.
		slices.SortStableFunc(list, func(a, b ledger.Reservation) int {
			return cmp.Or(a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.ID, b.ID))
		})
	case "unknown-inclusive-cursor":
		// A cursor compared with >= instead of >: the page starts with
		// the last row of the one before.
		if f.After != (store.UnknownCursor{}) {
			if r, err := s.Store.ReservationGet(ctx, f.After.ID); err == nil && r.State == ledger.StateUsageUnknown {
				list = append([]ledger.Reservation{r}, list...)[:min(f.Limit, len(list)+1)]
			}
		}
	}
	return list, nil
}

func (s brokenStore) ReservationsUnknownBacklog(ctx context.Context) (store.UnknownBacklog, error) {
	b, err := s.Store.ReservationsUnknownBacklog(ctx)
	if s.fault == "backlog-newest" && b.Count > 0 {
		// The age of the newest instead of the oldest.
		list, _ := s.Store.ReservationsUnknown(ctx, store.UnknownFilter{Limit: 1000})
		b.OldestMarkedAt = list[len(list)-1].UnknownAt
	}
	if s.fault == "backlog-by-start" && b.Count > 0 {
		// The age of the longest-running instead of the longest-waiting.
		list, _ := s.Store.ReservationsUnknown(ctx, store.UnknownFilter{Limit: 1000})
		b.OldestMarkedAt = slices.MinFunc(list, func(a, b ledger.Reservation) int { return a.StartedAt.Compare(b.StartedAt) }).StartedAt
	}
	return b, err
}

// AccountsInDebt lists from AccountList under the fault's predicate,
// cursor or order, after the real method has checked f.
func (s brokenStore) AccountsInDebt(ctx context.Context, f store.DebtFilter) ([]ledger.Account, error) {
	list, err := s.Store.AccountsInDebt(ctx, f)
	if err != nil || !strings.HasPrefix(s.fault, "debt-") {
		return list, err
	}
	owes := func(a *ledger.Account) bool {
		for _, b := range a.Balances {
			if b.OverdraftIssued > b.OverdraftRepaid {
				return true
			}
		}
		return false
	}
	order := func(a, b ledger.AccountKey) int {
		return cmp.Or(cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Route, b.Route), cmp.Compare(a.Region, b.Region),
			cmp.Compare(a.Generation, b.Generation))
	}
	inclusive := false
	switch s.fault {
	case "debt-repaid-listed":
		// Any overdraft ever drawn, repaid or not.
		owes = func(a *ledger.Account) bool {
			return slices.ContainsFunc(a.Balances[:], func(b ledger.Balance) bool { return b.OverdraftIssued > 0 })
		}
	case "debt-within-dims":
		owes = func(a *ledger.Account) bool { _, debt := a.Debt(); return debt > 0 }
	case "debt-inclusive-cursor":
		inclusive = true
	case "debt-generation-as-text":
		order = func(a, b ledger.AccountKey) int {
			return cmp.Or(cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Route, b.Route), cmp.Compare(a.Region, b.Region),
				cmp.Compare(strconv.FormatUint(a.Generation, 10), strconv.FormatUint(b.Generation, 10)))
		}
	}
	all, err := s.Store.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		return nil, err
	}
	list = nil
	for _, a := range all {
		c := order(a.Key, f.After)
		if owes(&a) && (f.After == (ledger.AccountKey{}) || c > 0 || (inclusive && c == 0)) {
			list = append(list, a)
		}
	}
	slices.SortFunc(list, func(a, b ledger.Account) int { return order(a.Key, b.Key) })
	return list[:min(f.Limit, len(list))], nil
}

// PolicyHeads answers under the fault: absent keys as zero heads, or
// only the first 128 distinct keys (one SQLite statement's worth).
func (s brokenStore) PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	switch s.fault {
	case "heads-absent-as-zero":
		heads, err := s.Store.PolicyHeads(ctx, keys)
		for _, k := range keys {
			if _, ok := heads[k]; !ok && err == nil {
				heads[k] = ledger.PolicyHead{Key: k}
			}
		}
		return heads, err
	case "heads-first-chunk":
		distinct := slices.Clone(keys)
		slices.SortFunc(distinct, ledger.PolicyKey.Compare)
		return s.Store.PolicyHeads(ctx, slices.Compact(distinct)[:min(128, len(slices.Compact(distinct)))])
	}
	return s.Store.PolicyHeads(ctx, keys)
}

// PoliciesOfGenerations answers under the fault: absent generations as
// zero policies, or only the first 128 distinct generations (one SQLite
// statement's worth).
func (s brokenStore) PoliciesOfGenerations(ctx context.Context, generations []uint64) (map[uint64]ledger.Policy, error) {
	switch s.fault {
	case "policies-absent-as-zero":
		policies, err := s.Store.PoliciesOfGenerations(ctx, generations)
		for _, g := range generations {
			if _, ok := policies[g]; !ok && err == nil {
				policies[g] = ledger.Policy{Generation: g}
			}
		}
		return policies, err
	case "policies-first-chunk":
		distinct := slices.Clone(generations)
		slices.Sort(distinct)
		distinct = slices.Compact(distinct)
		return s.Store.PoliciesOfGenerations(ctx, distinct[:min(128, len(distinct))])
	}
	return s.Store.PoliciesOfGenerations(ctx, generations)
}

// AccountsView answers under the fault "view-two-reads" from two reads,
// the accounts' and then the rest (the owing rows, heads and policies of
// a second view), the hook of store.WithBetweenReads between them.
func (s brokenStore) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	if s.fault != "view-two-reads" {
		return s.Store.AccountsView(ctx, subjects)
	}
	accounts, err := s.Store.AccountsOfSubjects(ctx, subjects)
	if err != nil {
		return store.AccountsView{}, err
	}
	store.BetweenReads(ctx)
	view, err := s.Store.AccountsView(store.WithBetweenReads(ctx, nil), subjects)
	view.Accounts = accounts
	return view, err
}

type brokenTx struct {
	store.Tx
	fault string
}

func (tx brokenTx) Write(ctx context.Context, c *store.Changes) error {
	changed := *c
	switch tx.fault {
	case "drop-shards":
		changed.Shards = nil
	case "upsert-reservations":
		// A reservation insert that overwrites instead of reporting
		// store.ErrDuplicate.
		changed.NewReservations = nil
	}
	return tx.Tx.Write(ctx, &changed)
}

// TestConformanceSuiteCatchesBrokenStores is the suite's negative control:
// each fault must fail the subtests named, so a check of storetest that
// silently stopped comparing would fail here. Each fault runs the suite in
// a child process, because a failing suite fails the test that runs it.
func TestConformanceSuiteCatchesBrokenStores(t *testing.T) {
	for fault, mustFail := range map[string][]string{
		"drop-shards":                  {"TestBrokenStoreHelper/RoundTrip", "TestBrokenStoreHelper/Lists"},
		"account-read":                 {"TestBrokenStoreHelper/RoundTrip"},
		"upsert-reservations":          {"TestBrokenStoreHelper/DuplicateReservationLeavesNothing"},
		"unknown-ties-by-id-desc":      {"TestBrokenStoreHelper/ReservationsUnknown"},
		"unknown-inclusive-cursor":     {"TestBrokenStoreHelper/ReservationsUnknown"},
		"unknown-by-start":             {"TestBrokenStoreHelper/ReservationsUnknown"},
		"backlog-newest":               {"TestBrokenStoreHelper/ReservationsUnknownBacklog"},
		"backlog-by-start":             {"TestBrokenStoreHelper/ReservationsUnknownBacklog"},
		"debt-repaid-listed":           {"TestBrokenStoreHelper/AccountsInDebt"},
		"debt-within-dims":             {"TestBrokenStoreHelper/AccountsInDebt"},
		"debt-inclusive-cursor":        {"TestBrokenStoreHelper/AccountsInDebt"},
		"debt-generation-as-text":      {"TestBrokenStoreHelper/AccountsInDebt"},
		"policy-page-inclusive-cursor": {"TestBrokenStoreHelper/PolicyPage"},
		"policy-page-route-ignored":    {"TestBrokenStoreHelper/PolicyPage"},
		"policy-page-newest-active":    {"TestBrokenStoreHelper/PolicyPage"},
		"policy-page-prefix-subject":   {"TestBrokenStoreHelper/PolicyPage"},
		"heads-absent-as-zero":         {"TestBrokenStoreHelper/PolicyHeads"},
		"heads-first-chunk":            {"TestBrokenStoreHelper/PolicyHeads"},
		"policies-absent-as-zero":      {"TestBrokenStoreHelper/PoliciesOfGenerations"},
		"policies-first-chunk":         {"TestBrokenStoreHelper/PoliciesOfGenerations"},
		"view-two-reads":               {"TestBrokenStoreHelper/AccountsViewOwingOneSnapshot", "TestBrokenStoreHelper/AccountsViewOneSnapshot"},
	} {
		t.Run(fault, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStoreHelper$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+fault)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store whose fault is %s:\n%s", fault, out)
			}
			for _, name := range mustFail {
				if !strings.Contains(string(out), "--- FAIL: "+name+" ") {
					t.Errorf("fault %s: subtest %s did not fail:\n%s", fault, name, out)
				}
			}
		})
	}
}

// TestBrokenStoreHelper runs the conformance suite on a broken store in the
// child process of TestConformanceSuiteCatchesBrokenStores.
func TestBrokenStoreHelper(t *testing.T) {
	fault := os.Getenv(brokenEnv)
	if fault == "" {
		t.Skip("helper process of TestConformanceSuiteCatchesBrokenStores")
	}
	storetest.Run(t, func(t *testing.T) store.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return brokenStore{Store: s, fault: fault}
	})
}
