package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// HeldElsewhereUpgrade is the upgrade story of the holds outstanding under
// a superseded generation (Account.HeldElsewhere), for a driver that can
// take its store back to the schema before the migration that counts
// them. On s, a fresh store: 600 tokens held under g0, g1 published (it
// limits requests, then tokens: units match by name), a reserve of 100
// tokens switches the subject to g1, which counts g0's 600. upgrade
// closes s, takes it back to that earlier schema (the migration that
// counts not applied, every count 0 as a store upgraded by the version
// before had them, or any count wrong) and opens it again, which
// migrates it. The migration
// counts g0's 600 on g1 again (ledger.HeldElsewhereOf), so 10 s later a
// reserve of 600 tokens, which the subject's holds under both generations
// would take past the burst of 1,000, is refused with no Retry-After;
// once g0's hold is released the count is 0 and the reserve fits. The
// audit finds nothing.
func HeldElsewhereUpgrade(t *testing.T, s store.Store, upgrade func(t *testing.T) store.Store) {
	ctx := context.Background()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	tokens := ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second}
	run := func(s store.Store, cmd ledger.Command) ledger.Result {
		t.Helper()
		res, err := apply(ctx, s, &cmd, now)
		if err != nil {
			t.Fatalf("%s %s: %v", cmd.Kind, cmd.ReservationID, err)
		}
		return res
	}
	publish := func(dims ...ledger.Dimension) uint64 {
		t.Helper()
		p := ledger.Policy{Key: key, Dimensions: dims, HoldTTL: time.Hour}.WithDefaults()
		res := run(s, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
		if res.Err != nil {
			t.Fatalf("publish: %v", res.Err)
		}
		return res.Generation
	}
	reserve := func(s store.Store, id string, units ledger.Amounts) ledger.Result {
		t.Helper()
		return run(s, ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: units})
	}
	account := func(s store.Store, g uint64) ledger.Account {
		t.Helper()
		a, err := s.AccountGet(ctx, ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: g})
		if err != nil {
			t.Fatalf("account of generation %d: %v", g, err)
		}
		return a
	}
	g0 := publish(tokens)
	if res := reserve(s, "old", ledger.Amounts{600}); res.Err != nil {
		t.Fatalf("reserve under g0: %v", res.Err)
	}
	g1 := publish(ledger.Dimension{Unit: "requests", Burst: 10, RefillUnits: 1, RefillInterval: time.Second}, tokens)
	if res := reserve(s, "new", ledger.Amounts{1, 100}); res.Err != nil {
		t.Fatalf("reserve under g1: %v", res.Err)
	}
	want := ledger.Amounts{0, 600}
	if got := account(s, g1).HeldElsewhere; got != want {
		t.Fatalf("before the upgrade g1 counts %v held elsewhere, want %v", got, want)
	}

	s = upgrade(t)
	if got := account(s, g1).HeldElsewhere; got != want {
		t.Fatalf("after the upgrade g1 counts %v held elsewhere, want %v (g0's 600 tokens)", got, want)
	}
	if got := account(s, g0).HeldElsewhere; got != (ledger.Amounts{}) {
		t.Fatalf("after the upgrade g0, not current, counts %v held elsewhere", got)
	}
	now = now.Add(10 * time.Second)
	res := reserve(s, "over", ledger.Amounts{0, 600})
	if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.RetryAfter != 0 {
		t.Fatalf("reserve of 600 tokens beside 600 held under g0 and 100 under g1 (g1 tokens %+v): %v, retry after %v; want insufficient capacity, no Retry-After",
			account(s, g1).Balances[1], res.Err, res.RetryAfter)
	}
	if res := run(s, ledger.Command{Kind: ledger.KindRelease, ReservationID: "old"}); res.Err != nil {
		t.Fatalf("release under g0: %v", res.Err)
	}
	if got := account(s, g1).HeldElsewhere; got != (ledger.Amounts{}) {
		t.Fatalf("after g0's hold was released g1 counts %v held elsewhere, want none", got)
	}
	if res := reserve(s, "over", ledger.Amounts{0, 600}); res.Err != nil {
		t.Fatalf("reserve of 600 tokens once g0's hold ended: %v (g1 tokens %+v)", res.Err, account(s, g1).Balances[1])
	}
	auditAll(t, s, "after the upgrade")
}
