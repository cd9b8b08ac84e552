package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// A file of schema version 13, whose epoch index is on epoch_start,
// migrates to the index on epoch_indexed with every entry at its
// account's epoch: AccountsByEpoch pages through the same accounts in the
// same order, within every bound, no entry lags, and the new binary's
// writes then leave a busy roll's entry behind until the catch-up.
func TestEpochIndexOfAnEarlierSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v13.db")
	db := dbAtSchema(t, path, 13)
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	var accounts []ledger.Account
	for i := range 40 {
		// Generations 1 and 2; four epoch starts, which do not follow the
		// keys' order.
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("s%02d", i), Route: "chat", Region: "eu",
			Generation: uint64(i%2 + 1)}, Dims: 1, EpochStart: epoch.Add(time.Duration((i*7)%4) * time.Hour), Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 90, Reserved: 10}
		a.EpochOpening[0] = ledger.Balance{Opening: 100, Available: 100}
		accounts = append(accounts, a)
		insertAccountAt(t, db, &a, "")
	}
	s := openUpgraded(t, db, path)

	// want returns generation g's accounts with an epoch start by bound
	// (any when zero), in (epoch start, key) order.
	want := func(g uint64, bound time.Time) []ledger.AccountKey {
		var list []ledger.Account
		for _, a := range accounts {
			if a.Key.Generation == g && (bound.IsZero() || !a.EpochStart.After(bound)) {
				list = append(list, a)
			}
		}
		slices.SortStableFunc(list, func(x, y ledger.Account) int {
			if c := x.EpochStart.Compare(y.EpochStart); c != 0 {
				return c
			}
			return compareKeys(x.Key, y.Key)
		})
		return keysOf(list)
	}
	check := func(when string) {
		t.Helper()
		for _, g := range []uint64{1, 2} {
			for _, bound := range []time.Time{{}, epoch, epoch.Add(2 * time.Hour), epoch.Add(-time.Hour)} {
				for _, limit := range []int{1, 3, 100} {
					got := keysByEpoch(t, s, store.EpochFilter{Generation: g, StartedBy: bound, Limit: limit})
					if w := want(g, bound); !slices.Equal(got, w) {
						t.Errorf("%s, generation %d by %v, pages of %d:\n got %v\nwant %v", when, g, bound, limit, got, w)
					}
				}
			}
		}
	}
	var lagging, total int
	if err := s.readDB.QueryRow("SELECT count(*) FILTER (WHERE epoch_indexed <> epoch_start), count(*) FROM accounts").Scan(&lagging, &total); err != nil {
		t.Fatal(err)
	}
	if lagging != 0 || total != len(accounts) {
		t.Fatalf("after the migration %d of %d accounts have epoch_indexed other than epoch_start; want 0 of %d", lagging, total, len(accounts))
	}
	check("migrated")

	// A busy roll (read, then written under its next epoch) is listed by
	// its new epoch start, from its old place, and at its new one after
	// the catch-up.
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	a, err := tx.AccountGet(ctx, accounts[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	a.EpochStart, a.EpochOpening = a.EpochStart.Add(3*time.Hour), a.Balances
	accounts[0] = *a
	if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{*a}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var indexed int64
	if err := s.readDB.QueryRow("SELECT epoch_indexed FROM accounts WHERE subject = 's00'").Scan(&indexed); err != nil || indexed != epoch.UnixNano() {
		t.Fatalf("s00's epoch_indexed after a busy roll: %d, %v; want its old epoch %d", indexed, err, epoch.UnixNano())
	}
	for _, bound := range []time.Time{{}, epoch.Add(3 * time.Hour), epoch.Add(2 * time.Hour)} {
		page, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 1, StartedBy: bound, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if listed := len(page) == 1 && page[0].Key == a.Key; listed != (bound != epoch.Add(2*time.Hour)) {
			t.Errorf("by %v, s00 (epoch %s, entry at %s) first: %v", bound, a.EpochStart, epoch, listed)
		}
	}
	if _, more, err := s.EpochIndexCatchUp(ctx, store.EpochFilter{Generation: 1, StartedBy: epoch, Limit: 100}); err != nil || more {
		t.Fatalf("catch-up: more %v, %v", more, err)
	}
	check("caught up")
}

// compareKeys orders account keys by subject, route, region.
func compareKeys(x, y ledger.AccountKey) int {
	for _, c := range [][2]string{{x.Subject, y.Subject}, {x.Route, y.Route}, {x.Region, y.Region}} {
		if c[0] != c[1] {
			if c[0] < c[1] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// A file of schema version 18 migrates to 19 with the index across
// generations holding every account, a lagging entry (epoch_indexed
// behind epoch_start: a busy roll before the upgrade) at its indexed
// place: AccountsByEpoch across generations lists every account within
// each bound, each once, and after EpochIndexCatchUp across generations
// in (epoch start, key, generation) order.
func TestEpochIndexAcrossGenerationsOfAnEarlierSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v18.db")
	db := dbAtSchema(t, path, 18)
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	var accounts []ledger.Account
	for i := range 30 {
		// Generations 1 to 3, one subject under several; four epoch
		// starts; every seventh entry lags an hour behind its epoch.
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("s%02d", i%10), Route: "chat", Region: "eu",
			Generation: uint64(i/10 + 1)}, Dims: 1, EpochStart: epoch.Add(time.Duration((i*7)%4) * time.Hour), Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 90, Reserved: 10}
		a.EpochOpening[0] = ledger.Balance{Opening: 100, Available: 100}
		accounts = append(accounts, a)
		indexed := a.EpochStart
		if i%7 == 0 {
			indexed = indexed.Add(-time.Hour)
		}
		insertAccountAt(t, db, &a, ", epoch_indexed", indexed.UnixNano())
	}
	s := openUpgraded(t, db, path)
	checkIndexMigrated(t, s, "accounts_by_epoch_across")

	// want returns the accounts with an epoch start by bound (any when
	// zero), in (epoch start, key, generation) order.
	want := func(bound time.Time) []ledger.AccountKey {
		var list []ledger.Account
		for _, a := range accounts {
			if bound.IsZero() || !a.EpochStart.After(bound) {
				list = append(list, a)
			}
		}
		slices.SortStableFunc(list, func(x, y ledger.Account) int {
			if c := x.EpochStart.Compare(y.EpochStart); c != 0 {
				return c
			}
			if c := compareKeys(x.Key, y.Key); c != 0 {
				return c
			}
			return int(x.Key.Generation) - int(y.Key.Generation)
		})
		return keysOf(list)
	}
	list := func(bound time.Time, limit int) []ledger.AccountKey {
		return keysByEpoch(t, s, store.EpochFilter{AllGenerations: true, StartedBy: bound, Limit: limit})
	}
	bounds := []time.Time{{}, epoch, epoch.Add(2 * time.Hour), epoch.Add(-time.Hour)}
	for _, bound := range bounds {
		for _, limit := range []int{1, 4, 100} {
			got, w := list(bound, limit), want(bound)
			slices.SortFunc(got, compareAcross)
			slices.SortFunc(w, compareAcross)
			if !slices.Equal(got, w) {
				t.Errorf("migrated, by %v, pages of %d, each once:\n got %v\nwant %v", bound, limit, got, w)
			}
		}
	}
	f := store.EpochFilter{AllGenerations: true, Limit: 4}
	for range 100 {
		next, more, err := s.EpochIndexCatchUp(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			break
		}
		f.After = next
	}
	for _, bound := range bounds {
		for _, limit := range []int{1, 4, 100} {
			if got, w := list(bound, limit), want(bound); !slices.Equal(got, w) {
				t.Errorf("caught up, by %v, pages of %d:\n got %v\nwant %v", bound, limit, got, w)
			}
		}
	}
}

// compareAcross orders account keys by subject, route, region and
// generation.
func compareAcross(x, y ledger.AccountKey) int {
	if c := compareKeys(x, y); c != 0 {
		return c
	}
	return int(x.Generation) - int(y.Generation)
}
