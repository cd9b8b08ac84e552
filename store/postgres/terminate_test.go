package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/postgres"
)

// TestServeSurvivesTerminatedBackends: two `capledger serve` replicas on
// one schema serve gateways reserving from one subject at its capacity
// edge (holds left open, rejections), while every connection the replicas
// hold to PostgreSQL is cut again and again with pg_terminate_backend (as
// an operator, a pooler restart or a failover would): batches die before,
// during and after COMMIT. Afterwards, read straight from the database: no
// unit was admitted beyond capacity, every acknowledged reservation and
// settle is stored as acknowledged, the audit finds nothing; both replicas
// are still up and answer; and retrying every reservation whose answer
// was lost, with its id, converges without a second debit.
func TestServeSurvivesTerminatedBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two server processes")
	}
	var random [4]byte
	rand.Read(random[:])
	app := "capledger_faults_" + hex.EncodeToString(random[:])
	dsn := withParam(t, schemaDSN(t), "application_name", app)
	bin := buildCapledger(t)
	replicas := []*replica{startReplica(t, bin, dsn), startReplica(t, bin, dsn)}
	const capacity = 8_000
	publishPolicy(t, replicas[0].addr, capacity, capacity)

	// Per replica a patient client (retries ride out most cuts) and an
	// impatient one (one attempt: its lost answers are resolved at the
	// end by retrying with the same id).
	var patient, impatient []*client.Client
	for _, r := range replicas {
		for _, attempts := range []int{8, 1} {
			c, err := client.New(r.addr, client.WithTimeout(5*time.Second),
				client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: attempts, BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond}))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if attempts == 1 {
				impatient = append(impatient, c)
			} else {
				patient = append(patient, c)
			}
		}
	}

	// The killer: every 100-300 ms it terminates every backend of the
	// replicas (found by their application_name).
	admin, err := pgx.Connect(context.Background(), serverDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var terminated atomic.Int64
	killerDone := make(chan struct{})
	stopKiller := make(chan struct{})
	go func() {
		defer close(killerDone)
		rng := mrand.New(mrand.NewPCG(3, 4))
		for {
			select {
			case <-stopKiller:
				return
			case <-time.After(time.Duration(100+rng.IntN(200)) * time.Millisecond):
			}
			var n int64
			if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT pg_terminate_backend(pid)
				FROM pg_stat_activity WHERE application_name = $1) k`, app).Scan(&n); err != nil {
				t.Errorf("terminate: %v", err)
				return
			}
			terminated.Add(n)
		}
	}()

	const gateways, perGateway = 8, 30
	sizes := []int64{600, 200, 100, 50}
	var (
		mu           sync.Mutex
		acknowledged = map[string]int64{} // reserve ok: id -> units
		settled      = map[string]int64{} // settle ok: id -> actual
		lost         = map[string]int64{} // reserve answer lost: id -> units
		rejections   atomic.Int64
		lostAnswers  atomic.Int64
	)
	var wg sync.WaitGroup
	for gw := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := mrand.New(mrand.NewPCG(uint64(gw), 9))
			clients := patient
			if gw%2 == 1 {
				clients = impatient
			}
			for i := range perGateway {
				id := fmt.Sprintf("rl-t%d-%d", gw, i)
				units := sizes[rng.IntN(len(sizes))]
				c := clients[rng.IntN(len(clients))]
				_, err := c.Reserve(ctx, client.ReserveRequest{ReservationID: id,
					Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": units}})
				var rejection *client.RejectedError
				switch {
				case err == nil:
					mu.Lock()
					acknowledged[id] = units
					mu.Unlock()
				case errors.As(err, &rejection):
					rejections.Add(1)
					continue
				case refused(err):
					t.Errorf("reserve %s refused: %v", id, err)
					continue
				default:
					lostAnswers.Add(1)
					mu.Lock()
					lost[id] = units
					mu.Unlock()
					continue
				}
				if i%4 == 0 {
					continue // held: the subject fills up
				}
				actual := rng.Int64N(units/4 + 1)
				op := "op-" + id
				_, err = clients[rng.IntN(len(clients))].Start(ctx, id, op)
				if err == nil || errors.Is(err, client.ErrAlreadyStarted) {
					_, err = clients[rng.IntN(len(clients))].Settle(ctx, id, op, client.Units{"tokens": actual})
				}
				switch {
				case err == nil:
					mu.Lock()
					settled[id] = actual
					mu.Unlock()
				case refused(err):
					t.Errorf("start/settle %s refused: %v", id, err)
				default:
					lostAnswers.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stopKiller)
	<-killerDone
	if terminated.Load() < 20 {
		t.Fatalf("only %d backends terminated: the test cut nothing", terminated.Load())
	}

	// The load's clients may still resend settles they kept: close them
	// so nothing changes the books behind the checks.
	for _, c := range append(patient, impatient...) {
		c.Close()
	}

	// Both replicas outlived the cuts and answer again.
	for _, r := range replicas {
		r.mu.Lock()
		exited := r.cmd == nil || r.cmd.ProcessState != nil
		r.mu.Unlock()
		if exited {
			t.Fatalf("replica %s exited:\n%s", r.addr, r.logs.String())
		}
	}
	ctx := context.Background()
	var fresh []*client.Client
	for i, r := range replicas {
		c, err := client.New(r.addr, client.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fresh = append(fresh, c)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, err = c.GetAccount(ctx, tenant7.Subject, tenant7.Route, tenant7.Region)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d does not answer after the cuts: %v", i, err)
			}
		}
	}

	s, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkHeld := func(when string) {
		t.Helper()
		snap := mustAudit(t, s)
		var reserved, spent, sources int64
		for _, a := range snap.Accounts {
			if a.Key.SubjectKey() == tenant7 {
				reserved += a.Balances[0].Reserved
				spent += a.Balances[0].Spent
				sources += a.Balances[0].Opening + a.Balances[0].Minted
			}
		}
		if reserved+spent > sources || sources != capacity {
			t.Errorf("%s: oversold: reserved %d + spent %d > capacity %d (sources %d)", when, reserved, spent, capacity, sources)
		}
	}
	checkHeld("after the cuts")
	for id, units := range acknowledged {
		r, err := s.ReservationGet(ctx, id)
		if err != nil || r.Reserved[0] != units {
			t.Errorf("acknowledged reservation %s (%d tokens): %v, stored %+v", id, units, err, r)
		}
	}
	for id, actual := range settled {
		r, err := s.ReservationGet(ctx, id)
		if err != nil || r.State != ledger.StateSettled || r.Actual[0] != actual {
			t.Errorf("acknowledged settle %s (%d tokens): %v, stored %+v", id, actual, err, r)
		}
	}

	// A gateway resolves each lost reserve answer by retrying with the
	// same id: a reservation that landed replays (no second debit), one
	// that did not is admitted or rejected now. The subject's reserved
	// grows by exactly the reserves admitted now.
	reservedOf := func(snap *ledger.Snapshot) (reserved int64) {
		for _, a := range snap.Accounts {
			if a.Key.SubjectKey() == tenant7 {
				reserved += a.Balances[0].Reserved
			}
		}
		return reserved
	}
	before := reservedOf(mustAudit(t, s))
	var landed int
	var admittedNow int64
	for id, units := range lost {
		stored, getErr := s.ReservationGet(ctx, id)
		_, err := fresh[0].Reserve(ctx, client.ReserveRequest{ReservationID: id,
			Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": units}})
		var rejection *client.RejectedError
		switch {
		case getErr == nil:
			landed++
			if err != nil {
				t.Errorf("retry of %s, stored as %s: %v", id, stored.State, err)
			}
		case errors.As(err, &rejection):
		case err != nil:
			t.Errorf("retry of lost %s: %v", id, err)
		default:
			admittedNow += units
		}
	}
	if after := reservedOf(mustAudit(t, s)); after-before != admittedNow {
		t.Errorf("retries of lost reserves moved reserved by %d, want %d (the ones admitted now): a replay debited again", after-before, admittedNow)
	}
	checkHeld("after the retries")
	t.Logf("%d backends terminated; %d reservations acknowledged, %d settles, %d rejections, %d answers lost (%d lost reserves, %d of them had landed)",
		terminated.Load(), len(acknowledged), len(settled), rejections.Load(), lostAnswers.Load(), len(lost), landed)
}
