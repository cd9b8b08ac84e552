package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// DrainProgress, reading the deciding accounts a page at a time, answers
// exactly what one AccountGet per account answered
// (drainProgressOneByOne), over a mix of accounts: blocked by burst (by
// available and by held units), not blocked (the deciding account has
// room, or none exists yet), blocked with no policy,
// debt, holds, an own policy beside a "*" one, open shards and a legacy
// budget; pages of 2 accounts, so a page's subjects are read together
// and pages split them; before and after a drain pass; on the in-memory
// store and SQLite.
func TestDrainProgressMatchesOneReadPerAccount(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := New(open(t), Options{DisableWorkers: true, PageSize: 2, Clock: func() time.Time { return t0 }})
			t.Cleanup(func() { e.Close() })
			do := func(cmd ledger.Command) {
				t.Helper()
				res, err := e.Do(ctx, cmd)
				if err != nil || res.Err != nil {
					t.Fatalf("%s %s: %+v, %v", cmd.Kind, cmd.Subject, res, err)
				}
			}
			publish := func(subject, route string, burst int64) {
				t.Helper()
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: route, Region: "eu"},
					Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst, MaxOverdraft: 100}}, EmergencyMode: true}.WithDefaults()
				do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			n := 0
			reserve := func(subject, route string, units, settle int64, release bool) {
				t.Helper()
				n++
				id := "rl-" + subject + "-" + string(rune('a'+n))
				do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: subject, Route: route, Region: "eu", Units: ledger.Amounts{units}})
				switch {
				case release:
					do(ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
				case settle > 0:
					do(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
					do(ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{settle}})
				}
			}
			key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
			shard := func(subject, id, gateway string, legacy bool) {
				t.Helper()
				do(ledger.Command{Kind: ledger.KindShardIssue, Subject: subject, Route: "chat.generate", Region: "eu",
					Units: ledger.Amounts{20}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway, BootEpoch: 1,
						TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key), Legacy: legacy}})
			}

			publish(ledger.AnySubject, "chat.generate", 1000) // generation 1
			publish("t-own", "chat.generate", 1000)           // generation 2
			publish("t-gone", "embed", 1000)                  // generation 3
			for _, s := range []string{"t-full", "t-held-full", "t-idle", "t-room", "t-a", "t-b", "t-c"} {
				reserve(s, "chat.generate", 10, 0, true) // 1000 available on generation 1
			}
			reserve("t-held", "chat.generate", 10, 0, false)      // a hold of 10
			reserve("t-debt", "chat.generate", 1000, 1050, false) // debt 50
			reserve("t-small", "chat.generate", 950, 950, false)
			reserve("t-own", "chat.generate", 10, 0, true)
			shard("t-a", "sh-1", "gw-a", false)
			shard("t-b", "lb-1", ledger.LegacyGateway("old-limiter"), true)
			reserve("t-gone", "embed", 10, 0, true)
			publish(ledger.AnySubject, "chat.generate", 100) // generation 4 supersedes 1
			publish("t-own", "chat.generate", 5)             // generation 5 supersedes 2
			reserve("t-full", "chat.generate", 1, 0, true)   // generation 4's account full (100 available)
			reserve("t-held-full", "chat.generate", 100, 0, false)
			reserve("t-room", "chat.generate", 60, 60, false) // 40 of the burst's room left
			reserve("t-own", "chat.generate", 1, 0, true)
			do(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: ledger.PolicyKey{Subject: "t-gone", Route: "embed", Region: "eu"}, Generation: 3})

			gens := []uint64{1, 2, 3, 4, 5}
			var sawBurst, sawNoPolicy, sawDebt, sawHeld, sawShards bool
			compare := func(when string) {
				t.Helper()
				want, err := drainProgressOneByOne(ctx, e, gens)
				if err != nil {
					t.Fatal(err)
				}
				got, err := e.DrainProgress(ctx, gens)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					for i := range want {
						if !reflect.DeepEqual(got[i], want[i]) {
							t.Errorf("%s, generation %d:\n got %+v\nwant %+v", when, want[i].Policy.Generation, got[i], want[i])
						}
					}
				}
				for _, d := range want {
					sawBurst = sawBurst || d.BlockedByBurst > 0
					sawNoPolicy = sawNoPolicy || d.BlockedNoPolicy > 0
					sawDebt = sawDebt || d.Debt[0] > 0
					sawHeld = sawHeld || d.Reserved[0] > 0
					sawShards = sawShards || d.LegacyBudgets > 0 && d.UnreconciledShards > d.LegacyBudgets
				}
			}
			compare("before the drain pass")
			if _, err := e.RunDrains(ctx); err != nil {
				t.Fatal(err)
			}
			compare("after the drain pass")
			if !sawBurst || !sawNoPolicy || !sawDebt || !sawHeld || !sawShards {
				t.Fatalf("the mix lacks a case: blocked by burst %v, no policy %v, debt %v, held %v, shards and a legacy budget %v",
					sawBurst, sawNoPolicy, sawDebt, sawHeld, sawShards)
			}
		})
	}
}
