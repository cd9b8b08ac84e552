package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// On a shared store the lease has one holder at a time: another holder is
// refused until the lease lapses (at the database's clock), then takes it
// over with the next fence. Only the lapse is meant to happen during the
// test: every lease that must still stand when a later step looks is taken
// for a minute, so a slow step on a loaded machine cannot let it lapse.
func TestLeaseOneHolderAtATime(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	const (
		standing = time.Minute            // outlives the test
		lapsing  = 100 * time.Millisecond // what the takeover waits out
	)
	a, err := s.LeaseAcquire(ctx, "workers", "replica-a", standing)
	if err != nil || !a.Held {
		t.Fatalf("replica-a: %+v, %v", a, err)
	}
	b, err := s.LeaseAcquire(ctx, "workers", "replica-b", standing)
	if err != nil {
		t.Fatal(err)
	}
	if b.Held || b.Holder != "replica-a" || b.Fence != a.Fence || !b.Expires.After(time.Now().Add(-time.Minute)) {
		t.Fatalf("replica-b while replica-a holds it: %+v, want refused naming replica-a, fence %d", b, a.Fence)
	}
	// A renewal keeps the lease and its fence (here it also shortens it);
	// a lapse hands it over.
	renewed, err := s.LeaseAcquire(ctx, "workers", "replica-a", lapsing)
	if err != nil || !renewed.Held || renewed.Fence != a.Fence || !renewed.Expires.Before(a.Expires) {
		t.Fatalf("renewal: %+v, %v; want held with fence %d, expiring before %v", renewed, err, a.Fence, a.Expires)
	}
	for {
		b, err = s.LeaseAcquire(ctx, "workers", "replica-b", standing)
		if err != nil {
			t.Fatal(err)
		}
		if b.Held {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b.Holder != "replica-b" || b.Fence != a.Fence+1 {
		t.Fatalf("takeover: %+v, want replica-b with fence %d", b, a.Fence+1)
	}
	if again, err := s.LeaseAcquire(ctx, "workers", "replica-a", standing); err != nil || again.Held {
		t.Fatalf("the old holder after the takeover: %+v, %v; want refused", again, err)
	}
	// A release by a non-holder changes nothing; the holder's hands it
	// over at once.
	if err := s.LeaseRelease(ctx, "workers", "replica-a"); err != nil {
		t.Fatal(err)
	}
	if again, err := s.LeaseAcquire(ctx, "workers", "replica-a", standing); err != nil || again.Held {
		t.Fatalf("release by a non-holder freed the lease: %+v, %v", again, err)
	}
	if err := s.LeaseRelease(ctx, "workers", "replica-b"); err != nil {
		t.Fatal(err)
	}
	if again, err := s.LeaseAcquire(ctx, "workers", "replica-a", standing); err != nil || !again.Held || again.Fence != b.Fence+1 {
		t.Fatalf("acquire after the holder released: %+v, %v; want held with fence %d", again, err, b.Fence+1)
	}
}

// Two engines on one PostgreSQL (two replicas): exactly one runs the
// workers. When the leader dies without releasing (its store connection
// is gone, as when the process is killed), the other takes the lease over
// once it lapses, and the next expiry still happens within the lease's
// ttl plus one renewal period plus one worker period (with slack for a
// loaded machine).
func TestWorkerLeaderTakeover(t *testing.T) {
	first, dsn := openStore(t)
	second, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	ctx := context.Background()
	p := seedPolicy()
	p.HoldTTL = 200 * time.Millisecond
	if res := commitCmds(t, first, time.Now(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	const (
		ttl    = 1200 * time.Millisecond
		period = 50 * time.Millisecond
	)
	opts := func(name string) engine.Options {
		return engine.Options{LeaseTTL: ttl, LeaseHolder: name, WorkerInterval: period, EpochInterval: time.Hour}
	}
	engines := map[string]*engine.Engine{"a": engine.New(first, opts("a")), "b": engine.New(second, opts("b"))}
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	stores := map[string]store.Store{"a": first, "b": second}

	// One leader, never two, over a few renewal periods.
	var leader string
	for i := 0; i < 100 || leader == ""; i++ {
		var leaders []string
		for name, e := range engines {
			if e.IsLeader() {
				leaders = append(leaders, name)
			}
		}
		if len(leaders) > 1 {
			t.Fatalf("two leaders at once: %v", leaders)
		}
		if len(leaders) == 1 {
			if leader != "" && leader != leaders[0] {
				t.Fatalf("leadership moved from %s to %s without a failure", leader, leaders[0])
			}
			leader = leaders[0]
		}
		if i > 1000 {
			t.Fatal("no leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	survivor := map[string]string{"a": "b", "b": "a"}[leader]
	if st := engines[survivor].Leader(); st.Leader || st.Holder != leader {
		t.Fatalf("the follower's view: %+v, want the lease held by %s", st, leader)
	}

	// The leader dies: its connections go first, so it can neither renew
	// nor release the lease.
	stores[leader].Close()
	killed := time.Now()
	engines[leader].Close()
	delete(engines, leader)

	// A hold reserved just now expires after 200ms; the survivor's workers
	// must expire it once the lease lapses.
	res, err := engines[survivor].Do(ctx, reserveCmd("rl-takeover", 100))
	if err != nil || res.Err != nil {
		t.Fatalf("reserve: %v %v", err, res.Err)
	}
	bound := killed.Add(ttl + ttl/3 + period + 3*time.Second)
	for {
		r, err := stores[survivor].ReservationGet(ctx, "rl-takeover")
		if err != nil {
			t.Fatal(err)
		}
		if r.State == ledger.StateExpired {
			break
		}
		if time.Now().After(bound) {
			t.Fatalf("not expired %v after the leader died (lease %v): %s; survivor's lease view %+v",
				time.Since(killed), ttl, r.State, engines[survivor].Leader())
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := engines[survivor].Leader()
	if !st.Leader || st.Holder != survivor || st.Since.Before(killed) {
		t.Fatalf("survivor's lease after the takeover: %+v", st)
	}
	t.Logf("took over %v after the leader died; expired by %v", st.Since.Sub(killed), time.Since(killed))
}
