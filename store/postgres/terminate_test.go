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
	"github.com/capledger/capledger/internal/replicatest"
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
	bin := replicatest.BuildCapledger(t)
	replicas := []*replicatest.Replica{replicatest.StartReplica(t, bin, dsn), replicatest.StartReplica(t, bin, dsn)}
	const capacity = 8_000
	publishPolicy(t, replicas[0].Addr, capacity, capacity)

	// Per replica a patient client (retries ride out most cuts) and an
	// impatient one (one attempt: its lost answers are resolved at the
	// end by retrying with the same id).
	var patient, impatient []*client.Client
	for _, r := range replicas {
		for _, attempts := range []int{8, 1} {
			c, err := client.New(r.Addr, client.WithTimeout(5*time.Second),
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

	// The killer: every 200-500 ms it terminates every backend of the
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
			case <-time.After(time.Duration(200+rng.IntN(300)) * time.Millisecond):
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

	// The gateways run until the cuts and the acknowledgements are enough
	// to prove something (a fixed count of reserves ended within a dozen
	// cuts on a quiet machine), or for at most a minute.
	const gateways = 8
	l := newGatewayLoad()
	stopLoad := make(chan struct{})
	go func() {
		defer close(stopLoad)
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			l.mu.Lock()
			acknowledged := len(l.acknowledged)
			l.mu.Unlock()
			if terminated.Load() >= 40 && acknowledged >= 100 {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for gw := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clients := patient
			if gw%2 == 1 {
				clients = impatient
			}
			l.gateway(t, fmt.Sprintf("rl-t%d", gw), uint64(gw), 0, stopLoad, clients, nil)
		}()
	}
	wg.Wait()
	close(stopKiller)
	<-killerDone
	if terminated.Load() < 20 || len(l.acknowledged) < 20 {
		t.Fatalf("%d backends terminated, %d reservations acknowledged: the test cut or admitted too little to prove anything",
			terminated.Load(), len(l.acknowledged))
	}

	// The load's clients may still resend settles they kept: close them
	// so nothing changes the books behind the checks.
	for _, c := range append(patient, impatient...) {
		c.Close()
	}

	// Both replicas outlived the cuts and answer again.
	fresh := stillServing(t, replicas)
	l.check(t, dsn, capacity, fresh[0])
	t.Logf("%d backends terminated; %s", terminated.Load(), l)
}

// gatewayLoad runs gateways that reserve from tenant7 at its capacity edge
// (a quarter of the holds left open, rejections expected), start and
// settle the rest, and keeps what they saw acknowledged and lost.
type gatewayLoad struct {
	mu           sync.Mutex
	acknowledged map[string]int64 // reserve ok: id -> units
	settled      map[string]int64 // settle ok: id -> actual
	lost         map[string]int64 // reserve answer lost: id -> units
	rejections   atomic.Int64
	lostAnswers  atomic.Int64
	// landed counts the lost reserves check found stored.
	landed int
}

func newGatewayLoad() *gatewayLoad {
	return &gatewayLoad{acknowledged: map[string]int64{}, settled: map[string]int64{}, lost: map[string]int64{}}
}

func (l *gatewayLoad) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%d reservations acknowledged, %d settles, %d rejections, %d answers lost (%d lost reserves, %d of them had landed)",
		len(l.acknowledged), len(l.settled), l.rejections.Load(), l.lostAnswers.Load(), len(l.lost), l.landed)
}

// gateway runs n lifecycles (until stop closes when n is 0) with ids
// prefix-0, prefix-1, ..., each call through a client picked from clients;
// answered, when set, counts the calls answered for sure (acknowledged, or
// rejected for capacity).
func (l *gatewayLoad) gateway(t *testing.T, prefix string, seed uint64, n int, stop <-chan struct{}, clients []*client.Client, answered *atomic.Int64) {
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(seed, 9))
	sizes := []int64{600, 200, 100, 50}
	ack := func() {
		if answered != nil {
			answered.Add(1)
		}
	}
	for i := 0; n == 0 || i < n; i++ {
		select {
		case <-stop:
			return
		default:
		}
		id := fmt.Sprintf("%s-%d", prefix, i)
		units := sizes[rng.IntN(len(sizes))]
		_, err := clients[rng.IntN(len(clients))].Reserve(ctx, client.ReserveRequest{ReservationID: id,
			Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": units}})
		var rejection *client.RejectedError
		switch {
		case err == nil:
			ack()
			l.mu.Lock()
			l.acknowledged[id] = units
			l.mu.Unlock()
		case errors.As(err, &rejection):
			ack()
			l.rejections.Add(1)
			time.Sleep(5 * time.Millisecond)
			continue
		case replicatest.Refused(err):
			t.Errorf("reserve %s refused: %v", id, err)
			continue
		default:
			l.lostAnswers.Add(1)
			l.mu.Lock()
			l.lost[id] = units
			l.mu.Unlock()
			time.Sleep(20 * time.Millisecond) // an unavailable replica may answer at once
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
			ack()
			l.mu.Lock()
			l.settled[id] = actual
			l.mu.Unlock()
		case replicatest.Refused(err):
			t.Errorf("start/settle %s refused: %v", id, err)
		default:
			l.lostAnswers.Add(1)
		}
	}
}

// check reads the schema of dsn directly: no unit admitted beyond
// capacity, the audit clean, every acknowledged reservation and settle
// stored as acknowledged. Then it retries every lost reserve through
// retry with its id: one that landed replays (no second debit), one that
// did not is admitted or rejected now, and reserved grows by exactly the
// reserves admitted now. Nothing else may write meanwhile.
func (l *gatewayLoad) check(t *testing.T, dsn string, capacity int64, retry *client.Client) {
	t.Helper()
	ctx := context.Background()
	s, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	books := func(when string) (reserved int64) {
		t.Helper()
		snap := mustAudit(t, s)
		var spent, sources int64
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
		return reserved
	}
	before := books("after the faults")
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, units := range l.acknowledged {
		r, err := s.ReservationGet(ctx, id)
		if err != nil || r.Reserved[0] != units {
			t.Errorf("acknowledged reservation %s (%d tokens): %v, stored %+v", id, units, err, r)
		}
	}
	for id, actual := range l.settled {
		r, err := s.ReservationGet(ctx, id)
		if err != nil || r.State != ledger.StateSettled || r.Actual[0] != actual {
			t.Errorf("acknowledged settle %s (%d tokens): %v, stored %+v", id, actual, err, r)
		}
	}
	var admittedNow int64
	retryStart := time.Now()
	defer func() {
		t.Logf("%d lost reserves retried in %s", len(l.lost), time.Since(retryStart).Round(time.Millisecond))
	}()
	for id, units := range l.lost {
		stored, getErr := s.ReservationGet(ctx, id)
		_, err := retry.Reserve(ctx, client.ReserveRequest{ReservationID: id,
			Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": units}})
		var rejection *client.RejectedError
		switch {
		case getErr == nil:
			l.landed++
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
	if after := books("after the retries"); after-before != admittedNow {
		t.Errorf("retries of lost reserves moved reserved by %d, want %d (the ones admitted now): a replay debited again", after-before, admittedNow)
	}
}

// stillServing fails the test unless every replica's process is still
// running and answers a read within 30 s; it returns a client for each.
func stillServing(t *testing.T, replicas []*replicatest.Replica) []*client.Client {
	t.Helper()
	ctx := context.Background()
	var clients []*client.Client
	for i, r := range replicas {
		if r.Exited() {
			t.Fatalf("replica %d exited:\n%s", i, r.Logs.String())
		}
		c, err := client.New(r.Addr, client.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, err = c.GetAccount(ctx, tenant7.Subject, tenant7.Route, tenant7.Region)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d does not answer: %v", i, err)
			}
		}
	}
	return clients
}
