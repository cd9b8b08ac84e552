package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/replicatest"
)

// TestGatewaysRacingTheSameIDs: gateways on different replicas send the
// same reservation id at the same instant, as a retry racing its original
// or two gateways sharing an idempotency key do. For each id: four
// reserves (two of one request, two of another with a different digest),
// then three starts with different operation ids racing a release, then
// three settles of the winning operation with different usage racing a
// settle naming another operation. Each step has exactly one winner:
// exactly one reserve debits (the others of its digest replay, the
// others are refused as a digest mismatch), one of the starts or the
// release wins and the rest are refused, one settle applies; the stored
// reservation is the winners', the account's reserved and spent are the
// sums of the winners' units, and the audit is clean. It runs on two
// replicas sharing PostgreSQL and on one SQLite process (where the racing
// commands often share one group-commit batch).
func TestGatewaysRacingTheSameIDs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := replicatest.BuildCapledger(t)
	t.Run("postgres", func(t *testing.T) {
		dsn := schemaDSN(t)
		testRacingIDs(t, replicatest.StartReplica(t, bin, dsn), replicatest.StartReplica(t, bin, dsn))
	})
	t.Run("sqlite", func(t *testing.T) {
		r := replicatest.StartReplica(t, bin, "sqlite:"+filepath.Join(t.TempDir(), "capledger.db"))
		testRacingIDs(t, r, r)
	})
}

func testRacingIDs(t *testing.T, replicas ...*replicatest.Replica) {
	publishPolicy(t, replicas[0].Addr, 1<<40, 1<<30)
	var clients []*client.Client
	for _, r := range replicas {
		c, err := client.New(r.Addr, client.WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	ctx := context.Background()
	// race runs the calls at once, call i through clients[i%2], and
	// returns their errors.
	race := func(calls ...func(*client.Client) error) []error {
		errs := make([]error, len(calls))
		var ready, done sync.WaitGroup
		fire := make(chan struct{})
		for i, call := range calls {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-fire
				errs[i] = call(clients[i%len(clients)])
			}()
		}
		ready.Wait()
		close(fire)
		done.Wait()
		return errs
	}
	// refusedAs reports whether err is one of the refusals a loser may get.
	refusedAs := func(err error, sentinels ...error) bool {
		for _, s := range sentinels {
			if errors.Is(err, s) {
				return true
			}
		}
		return false
	}

	const ids = 30
	// Every id ends released or settled: nothing stays reserved.
	var wantReserved, wantSpent int64
	winners := map[string]int{}
	for n := range ids {
		id := fmt.Sprintf("rl-race-%d", n)
		reserve := func(units int64, body string, replayed *bool) func(*client.Client) error {
			return func(c *client.Client) error {
				res, err := c.Reserve(ctx, client.ReserveRequest{ReservationID: id, Subject: tenant7.Subject, Route: tenant7.Route,
					Region: tenant7.Region, Units: client.Units{"tokens": units}, BodyHash: body})
				if err == nil {
					*replayed = res.Replayed
				}
				return err
			}
		}
		// Calls 0 and 2 go to one replica, 1 and 3 to the other: each
		// request is sent to both.
		var replayed [4]bool
		errs := race(reserve(100, "a", &replayed[0]), reserve(100, "a", &replayed[1]),
			reserve(300, "b", &replayed[2]), reserve(300, "b", &replayed[3]))
		var admitted, succeeded int
		wins := map[string]bool{}
		for i, err := range errs {
			switch {
			case err == nil:
				succeeded++
				wins[[]string{"a", "a", "b", "b"}[i]] = true
				if !replayed[i] {
					admitted++
				}
			case refusedAs(err, client.ErrDigestMismatch):
			default:
				t.Fatalf("%s: reserve %d: %v", id, i, err)
			}
		}
		if admitted != 1 || len(wins) != 1 || succeeded != 2 {
			t.Fatalf("%s: %d reserves admitted (want 1), %d succeeded (want the 2 of one digest), digests %v; errors %v",
				id, admitted, succeeded, wins, errs)
		}
		units := int64(100)
		if wins["b"] {
			units = 300
		}
		got, err := clients[0].GetReservation(ctx, id)
		if err != nil || got.GetReservedUnits()["tokens"] != units {
			t.Fatalf("%s: stored %v, %v; want the winning %d tokens", id, got, err, units)
		}

		// Three starts with their own operation ids, and a release.
		ops := []string{"op-x-" + id, "op-y-" + id, "op-z-" + id}
		start := func(op string) func(*client.Client) error {
			return func(c *client.Client) error { _, err := c.Start(ctx, id, op); return err }
		}
		errs = race(start(ops[0]), start(ops[1]), start(ops[2]),
			func(c *client.Client) error { _, err := c.Release(ctx, id); return err })
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil:
				if winner >= 0 {
					t.Fatalf("%s: both call %d and call %d won (0-2 start, 3 release): %v", id, winner, i, errs)
				}
				winner = i
			case refusedAs(err, client.ErrAlreadyStarted, client.ErrOperationMismatch, client.ErrReleased, client.ErrNotStarted):
			default:
				t.Fatalf("%s: call %d (0-2 start, 3 release): %v", id, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("%s: neither a start nor the release won: %v", id, errs)
		}
		winners[[]string{"start", "start", "start", "release"}[winner]]++
		got, err = clients[1].GetReservation(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if winner == 3 {
			if got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_RELEASED {
				t.Fatalf("%s: the release won, stored %s", id, got.GetState())
			}
			continue
		}
		if got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_STARTED || got.GetOperationId() != ops[winner] {
			t.Fatalf("%s: %s won the start, stored %s bound to %s", id, ops[winner], got.GetState(), got.GetOperationId())
		}

		// Settles of the winning operation with different usage (a
		// duplicated completion whose usage changed), and one naming
		// another operation.
		op := ops[winner]
		settle := func(op string, actual int64) func(*client.Client) error {
			return func(c *client.Client) error {
				_, err := c.Settle(ctx, id, op, client.Units{"tokens": actual})
				return err
			}
		}
		actuals := []int64{units / 4, units / 2, units, 0}
		errs = race(settle(op, actuals[0]), settle(op, actuals[1]), settle(op, actuals[2]), settle(ops[(winner+1)%3], actuals[3]))
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && i < 3:
				if won >= 0 {
					t.Fatalf("%s: settles %d and %d both applied: %v", id, won, i, errs)
				}
				won = i
			case err == nil:
				t.Fatalf("%s: a settle naming operation %s, not the started %s, applied", id, ops[(winner+1)%3], op)
			case refusedAs(err, client.ErrAlreadySettled, client.ErrOperationMismatch):
			default:
				t.Fatalf("%s: settle %d: %v", id, i, err)
			}
		}
		if won < 0 {
			t.Fatalf("%s: no settle applied: %v", id, errs)
		}
		got, err = clients[0].GetReservation(ctx, id)
		if err != nil || got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED || got.GetActualUnits()["tokens"] != actuals[won] {
			t.Fatalf("%s: settle of %d won, stored %v, %v", id, actuals[won], got, err)
		}
		wantSpent += actuals[won]
	}

	accounts, err := clients[0].GetAccount(ctx, tenant7.Subject, tenant7.Route, tenant7.Region)
	if err != nil {
		t.Fatal(err)
	}
	var reserved, spent int64
	for _, a := range accounts {
		for _, d := range a.GetBalances() {
			if d.GetUnit() == "tokens" {
				reserved += d.GetReserved()
				spent += d.GetSpent()
			}
		}
	}
	if reserved != wantReserved || spent != wantSpent {
		t.Fatalf("account reserved %d spent %d; the winners reserved %d and spent %d", reserved, spent, wantReserved, wantSpent)
	}
	if d, err := clients[1].Audit(ctx); err != nil || len(d) != 0 {
		t.Fatalf("audit: %v %v", d, err)
	}
	t.Logf("%d ids raced: %v won the start/release race", ids, winners)
}
