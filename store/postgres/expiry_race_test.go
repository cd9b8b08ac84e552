package postgres_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/replicatest"
)

// TestStartRacingExpiry: executors start reservations right around the end
// of their hold, while the servers' own expiry worker (real clock, every
// 250 ms) claims holds that ran out. Each reservation ends one way only:
// an acknowledged start keeps it running (expiry never takes STARTED work,
// so it stays STARTED and its settle charges the usage), a start refused as
// expired leaves it EXPIRED with its hold given back; nothing stays
// reserved, spent is the settled usage, and the audit is clean. Runs on
// two replicas sharing PostgreSQL (starts through both, expiry on the
// lease holder) and on one SQLite process.
func TestStartRacingExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := replicatest.BuildCapledger(t)
	t.Run("postgres", func(t *testing.T) {
		dsn := schemaDSN(t)
		testStartRacingExpiry(t, replicatest.StartReplica(t, bin, dsn), replicatest.StartReplica(t, bin, dsn))
	})
	t.Run("sqlite", func(t *testing.T) {
		r := replicatest.StartReplica(t, bin, "sqlite:"+filepath.Join(t.TempDir(), "capledger.db"))
		testStartRacingExpiry(t, r, r)
	})
}

func testStartRacingExpiry(t *testing.T, replicas ...*replicatest.Replica) {
	const holdTTL = 300 * time.Millisecond
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
	if _, _, err := clients[0].PublishPolicy(ctx, &ledgerv1.Policy{
		Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1 << 40}},
		HoldTtl:    durationpb.New(holdTTL),
	}); err != nil {
		t.Fatal(err)
	}

	const executors, each = 12, 10
	type outcome struct {
		id      string
		started bool
		actual  int64
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		wg       sync.WaitGroup
	)
	for x := range executors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(x), 5))
			for i := range each {
				id := fmt.Sprintf("rl-exp-%d-%d", x, i)
				c := clients[rng.IntN(len(clients))]
				res, err := c.Reserve(ctx, client.ReserveRequest{ReservationID: id, Subject: tenant7.Subject,
					Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": 100}})
				if err != nil {
					t.Errorf("reserve %s: %v", id, err)
					return
				}
				// Start between 100 ms before the hold ends and 350 ms
				// after (the worker claims within 250 ms of the end).
				at := res.Reservation.GetExpiresAt().AsTime().Add(time.Duration(rng.IntN(450)-100) * time.Millisecond)
				time.Sleep(time.Until(at))
				_, err = clients[rng.IntN(len(clients))].Start(ctx, id, "op-"+id)
				o := outcome{id: id, started: err == nil, actual: int64(rng.IntN(101))}
				switch {
				case err == nil, errors.Is(err, client.ErrExpired):
				default:
					t.Errorf("start %s: %v", id, err)
					return
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// Give the expiry worker several passes over every hold that ended.
	time.Sleep(4 * 250 * time.Millisecond)

	var started, expired int
	var wantSpent int64
	for _, o := range outcomes {
		got, err := clients[0].GetReservation(ctx, o.id)
		if err != nil {
			t.Fatal(err)
		}
		if !o.started {
			expired++
			if got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED {
				t.Errorf("%s: start refused as expired, stored %s", o.id, got.GetState())
			}
			continue
		}
		started++
		if got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_STARTED {
			t.Errorf("%s: start acknowledged, then %s: running work lost its hold", o.id, got.GetState())
			continue
		}
		if _, err := clients[1].Settle(ctx, o.id, "op-"+o.id, client.Units{"tokens": o.actual}); err != nil {
			t.Errorf("settle %s: %v", o.id, err)
			continue
		}
		wantSpent += o.actual
	}
	if started == 0 || expired == 0 {
		t.Fatalf("%d starts won, %d lost to expiry: the race did not happen both ways", started, expired)
	}
	accounts, err := clients[0].GetAccount(ctx, tenant7.Subject, tenant7.Route, tenant7.Region)
	if err != nil {
		t.Fatal(err)
	}
	var reserved, spent int64
	for _, a := range accounts {
		for _, b := range a.GetBalances() {
			reserved += b.GetReserved()
			spent += b.GetSpent()
		}
	}
	if reserved != 0 || spent != wantSpent {
		t.Errorf("account reserved %d spent %d, want 0 and the settled %d", reserved, spent, wantSpent)
	}
	if d, err := clients[1].Audit(ctx); err != nil || len(d) != 0 {
		t.Fatalf("audit: %v %v", d, err)
	}
	t.Logf("%d starts won, %d lost to expiry", started, expired)
}
