package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
	"github.com/capledger/capledger/store/storetest"
)

var t0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

// clock is a settable test clock.
type clock struct{ nanos atomic.Int64 }

func newClock() *clock                   { c := &clock{}; c.nanos.Store(t0.UnixNano()); return c }
func (c *clock) Now() time.Time          { return time.Unix(0, c.nanos.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.nanos.Add(int64(d)) }

func publish(t *testing.T, e *Engine, burst int64, hold, execLimit time.Duration) {
	t.Helper()
	p := ledger.Policy{
		Key:            ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions:     []ledger.Dimension{{Unit: "tokens", Burst: burst, RefillUnits: 10, RefillInterval: time.Second}},
		HoldTTL:        hold,
		ExecutionLimit: execLimit,
	}.WithDefaults()
	res, err := e.Do(context.Background(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	if err != nil || res.Err != nil {
		t.Fatalf("publish: %v %v", err, res.Err)
	}
}

// mustDo runs cmd on e and fails the test unless it was applied without
// an error.
func mustDo(t *testing.T, e *Engine, cmd ledger.Command) ledger.Result {
	t.Helper()
	res, err := e.Do(context.Background(), cmd)
	if err != nil || res.Err != nil {
		t.Fatalf("%s: %+v, %v", cmd.Kind, res, err)
	}
	return res
}

func reserveCmd(id string, units int64) ledger.Command {
	return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
		Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{units}}
}

func auditClean(t *testing.T, e *Engine) {
	t.Helper()
	discrepancies, err := e.Audit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range discrepancies {
		t.Errorf("audit: %s", d)
	}
}

// leadingEngine returns an engine on st with opts, its workers off (the
// test runs their passes by hand) and taking itself for the leader (the
// passes act only on the leader), closed when the test ends.
func leadingEngine(t *testing.T, st store.Store, opts Options) *Engine {
	t.Helper()
	opts.DisableWorkers = true
	e := New(st, opts)
	t.Cleanup(func() { e.Close() })
	e.lead.mu.Lock()
	e.lead.status.Leader, e.lead.until = true, time.Now().Add(time.Hour)
	e.lead.mu.Unlock()
	return e
}

// memstoreAndSQLite opens, by name, each store that the tests the engine
// must pass on every store run on: an in-memory store, and a SQLite store
// in the test's temporary directory, closed when the test ends.
var memstoreAndSQLite = map[string]func(t *testing.T) store.Store{
	"memstore": func(*testing.T) store.Store { return memstore.New() },
	"sqlite": func(t *testing.T) store.Store {
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "capledger.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	},
}

// withPostgres is stores and, with CAPLEDGER_TEST_POSTGRES set, a
// PostgreSQL store on a fresh schema (replicatest.SchemaDSN), closed when
// the test ends: for the engine tests whose subject is what each driver's
// indexes answer.
func withPostgres(stores map[string]func(t *testing.T) store.Store) map[string]func(t *testing.T) store.Store {
	out := maps.Clone(stores)
	if os.Getenv(replicatest.EnvDSN) == "" {
		return out
	}
	out["postgres"] = func(t *testing.T) store.Store {
		st, err := postgres.Open(context.Background(), replicatest.SchemaDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	return out
}

// changeAccountBehindTheJournal raises the opening and the available
// units of st's only account by one, in a transaction of its own with no
// journal entry: conservation still holds, but replaying the journal no
// longer gives the account (the audit's journal_replay check).
func changeAccountBehindTheJournal(t *testing.T, st store.Store) {
	t.Helper()
	shiftAccountBehindTheJournal(t, st, 1)
}

// shiftAccountBehindTheJournal adds delta to the only account's opening
// and available in the store, with no journal entry (-1 after
// changeAccountBehindTheJournal repairs it).
func shiftAccountBehindTheJournal(t *testing.T, st store.Store, delta int64) {
	t.Helper()
	shiftSubjectBehindTheJournal(t, st, "", delta)
}

// shiftSubjectBehindTheJournal adds delta to the opening and available of
// subject's only account ("": the store's only account), with no journal
// entry.
func shiftSubjectBehindTheJournal(t *testing.T, st store.Store, subject string, delta int64) {
	t.Helper()
	accounts, err := st.AccountList(context.Background(), ledger.PolicyKey{})
	if err != nil || subject == "" && len(accounts) != 1 {
		t.Fatalf("accounts %v %v", accounts, err)
	}
	for _, a := range accounts {
		if subject != "" && a.Key.Subject != subject {
			continue
		}
		a.Balances[0].Opening += delta
		a.Balances[0].Available += delta
		writeBehindTheJournal(t, st, &store.Changes{Accounts: []ledger.Account{a}})
		return
	}
	t.Fatalf("no account of %s in %v", subject, accounts)
}

// writeBehindTheJournal writes changes to st in a transaction of its own,
// with no journal entry: what an audit must find.
func writeBehindTheJournal(t *testing.T, st store.Store, changes *store.Changes) {
	t.Helper()
	storetest.Commit(t, st, changes)
}

// gatedStore holds the first Begin until released, so requests pile up
// behind one batch exactly as they do under load, and can fail commits.
type gatedStore struct {
	store.Store
	gate      chan struct{}
	once      sync.Once
	conflicts atomic.Int32 // commits left to fail with ErrConflict
	begins    atomic.Int32
}

func (g *gatedStore) Begin(ctx context.Context) (store.Tx, error) {
	g.begins.Add(1)
	g.once.Do(func() { <-g.gate })
	tx, err := g.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &conflictTx{Tx: tx, g: g}, nil
}

type conflictTx struct {
	store.Tx
	g *gatedStore
}

func (tx *conflictTx) Commit(ctx context.Context) error {
	if tx.g.conflicts.Load() > 0 {
		tx.g.conflicts.Add(-1)
		tx.Tx.Rollback(ctx)
		return fmt.Errorf("simulated: %w", store.ErrConflict)
	}
	return tx.Tx.Commit(ctx)
}

func TestGroupCommitBatchesWaitingCallers(t *testing.T) {
	gated := &gatedStore{Store: memstore.New(), gate: make(chan struct{})}
	e := New(gated, Options{DisableWorkers: true, MaxBatch: 1000})
	defer e.Close()

	// The first command (the publish) holds the committer at Begin while
	// 200 reserves queue up behind it.
	published := make(chan struct{})
	go func() { publish(t, e, 100000, time.Minute, 0); close(published) }()
	for gated.begins.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.Do(context.Background(), reserveCmd(fmt.Sprintf("rl-%03d", i), 10))
			if err == nil {
				err = res.Err
			}
			errs <- err
		}()
	}
	for len(e.queue) < 200 {
		time.Sleep(time.Millisecond)
	}
	close(gated.gate)
	wg.Wait()
	<-published
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	stats := e.Stats()
	if stats.Commands != 201 {
		t.Fatalf("commands %d, want 201", stats.Commands)
	}
	// One batch for the publish, then the 200 queued reserves in one.
	if stats.Batches != 2 {
		t.Fatalf("batches %d: queued callers were not grouped into one transaction", stats.Batches)
	}
	auditClean(t, e)
}

func TestConflictedBatchIsRetriedWhole(t *testing.T) {
	gated := &gatedStore{Store: memstore.New(), gate: make(chan struct{})}
	close(gated.gate)
	e := New(gated, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	gated.conflicts.Store(2)
	res, err := e.Do(context.Background(), reserveCmd("rl-1", 600))
	if err != nil || res.Err != nil || res.Replayed {
		t.Fatalf("reserve after two conflicts: %v %+v", err, res)
	}
	if got := e.Stats().Conflicts; got != 2 {
		t.Fatalf("conflicts counted %d, want 2", got)
	}
	accounts, _ := e.Accounts(context.Background(), ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if len(accounts) != 1 || accounts[0].Balances[0].Reserved != 600 {
		t.Fatalf("a retried batch must apply once: %+v", accounts)
	}
	auditClean(t, e)
}

func TestFailedCommitAnswersErrorAndAppliesNothing(t *testing.T) {
	ms := memstore.New()
	e := New(ms, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	ms.FailNextCommit(errors.New("disk on fire"))
	if _, err := e.Do(context.Background(), reserveCmd("rl-1", 600)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a failed commit must reach the caller as unavailable, got %v", err)
	}
	if _, err := e.Reservation(context.Background(), "rl-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failed batch left its reservation behind: %v", err)
	}
	res, err := e.Do(context.Background(), reserveCmd("rl-1", 600))
	if err != nil || res.Err != nil || res.Replayed {
		t.Fatalf("retry after a failed commit: %v %+v", err, res)
	}
	if err := e.Ready(); err != nil {
		t.Fatalf("Ready after recovery: %v", err)
	}
	auditClean(t, e)
}

// Ready reports a failed batch while the store still refuses writes, and
// comes back once the store takes one again, without any command: a
// replica that readiness took out of rotation gets none.
func TestReadyComesBackWhenTheStoreDoesWithoutTraffic(t *testing.T) {
	ms := memstore.New()
	e := New(ms, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	ms.FailCommits(errors.New("disk on fire"))
	if _, err := e.Do(context.Background(), reserveCmd("rl-1", 600)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a failed commit must reach the caller as unavailable, got %v", err)
	}
	if err := e.Ready(); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Ready while the store refuses writes: %v", err)
	}
	ms.FailCommits(nil)
	// Within readyProbeEvery of the last probe Ready does not probe again.
	if err := e.Ready(); err == nil {
		t.Fatal("Ready probed again within readyProbeEvery")
	}
	e.lastProbe.Store(0) // as if readyProbeEvery had passed
	if err := e.Ready(); err != nil {
		t.Fatalf("Ready after the store recovered, without traffic: %v", err)
	}
	tx, err := ms.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v, err := tx.MetaGet(context.Background(), MetaReadyProbe); err != nil || v == 0 {
		t.Fatalf("the probe's write: %d %v", v, err)
	}
	tx.Rollback(context.Background())
	// A failure after recovery is reported again.
	ms.FailCommits(errors.New("disk on fire again"))
	if _, err := e.Do(context.Background(), reserveCmd("rl-2", 1)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("second failure: %v", err)
	}
	e.lastProbe.Store(0)
	if err := e.Ready(); err == nil || !strings.Contains(err.Error(), "again") {
		t.Fatalf("Ready after the second failure: %v", err)
	}
	ms.FailCommits(nil)
	res, err := e.Do(context.Background(), reserveCmd("rl-1", 600))
	if err != nil || res.Err != nil || res.Replayed {
		t.Fatalf("retry after the store recovered: %v %+v", err, res)
	}
	if err := e.Ready(); err != nil {
		t.Fatalf("Ready after a batch worked: %v", err)
	}
	auditClean(t, e)
}

func TestLostCommitAckConvergesOnRetryWithSameID(t *testing.T) {
	ms := memstore.New()
	e := New(ms, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	ms.LoseNextCommitAck()
	if _, err := e.Do(context.Background(), reserveCmd("rl-1", 600)); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, ErrNotApplied) {
		t.Fatalf("lost ack must not look like success, nor like nothing applied: %v", err)
	}
	res, err := e.Do(context.Background(), reserveCmd("rl-1", 600))
	if err != nil || res.Err != nil || !res.Replayed {
		t.Fatalf("retry with the same id must replay the durable reservation: %v %+v", err, res)
	}
	accounts, _ := e.Accounts(context.Background(), ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if accounts[0].Balances[0].Reserved != 600 {
		t.Fatalf("debited twice: reserved %d", accounts[0].Balances[0].Reserved)
	}
	auditClean(t, e)
}

// A mass expiry is committed in chunks of at most workerChunk commands,
// and after each chunk the workers pause for twice as long as it took, so
// admission keeps at least two thirds of the committer.
func TestWorkerCommitsAreChunkedAndPaced(t *testing.T) {
	clk := newClock()
	type batch struct {
		commands int
		start    time.Time
		took     time.Duration
	}
	var mu sync.Mutex
	var batches []batch
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now, OnBatch: func(b BatchInfo) {
		mu.Lock()
		defer mu.Unlock()
		end := time.Now()
		batches = append(batches, batch{b.Commands, end.Add(-b.Duration), b.Duration})
	}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 1000, 10*time.Second, 30*time.Second)
	const holds = 200
	cmds := make([]ledger.Command, holds)
	for i := range cmds {
		cmds[i] = reserveCmd(fmt.Sprintf("rl-%d", i), 1)
	}
	if _, err := e.DoBatch(ctx, cmds); err != nil {
		t.Fatal(err)
	}
	clk.Advance(11 * time.Second)
	mu.Lock()
	batches = nil
	mu.Unlock()
	e.runDue(ctx)

	for i := range holds {
		if r, _ := e.Reservation(ctx, fmt.Sprintf("rl-%d", i)); r.State != ledger.StateExpired {
			t.Fatalf("rl-%d: %s, want EXPIRED", i, r.State)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := (2*holds + workerChunk - 1) / workerChunk; len(batches) < want {
		t.Fatalf("%d worker batches for %d commands, want at least %d", len(batches), 2*holds, want)
	}
	for i, b := range batches {
		if b.commands > workerChunk {
			t.Errorf("batch %d carried %d worker commands, more than %d", i, b.commands, workerChunk)
		}
		if i > 0 {
			prev := batches[i-1]
			// At most a third of the committer: a pause of twice the chunk.
			if gap := b.start.Sub(prev.start.Add(prev.took)); gap < 2*prev.took {
				t.Errorf("batch %d started %s after batch %d, which took %s: want a pause of at least %s", i, gap, i-1, prev.took, 2*prev.took)
			}
		}
	}
}

func TestWorkersExpireHoldsAndMarkOverrunsUnknown(t *testing.T) {
	clk := newClock()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 1000, 10*time.Second, 30*time.Second)
	for _, c := range []ledger.Command{reserveCmd("rl-held", 300), reserveCmd("rl-run", 300)} {
		if res, err := e.Do(ctx, c); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindStart, ReservationID: "rl-run", OperationID: "op-1"}); err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	e.runDue(ctx) // nothing is due yet
	if r, _ := e.Reservation(ctx, "rl-held"); r.State != ledger.StateReserved {
		t.Fatalf("expired before its TTL: %s", r.State)
	}
	clk.Advance(11 * time.Second)
	e.runDue(ctx)
	if r, _ := e.Reservation(ctx, "rl-held"); r.State != ledger.StateExpired {
		t.Fatalf("hold past its TTL: %s, want EXPIRED", r.State)
	}
	if r, _ := e.Reservation(ctx, "rl-run"); r.State != ledger.StateStarted {
		t.Fatalf("expiry touched started work: %s", r.State)
	}
	clk.Advance(20 * time.Second)
	e.runDue(ctx)
	r, _ := e.Reservation(ctx, "rl-run")
	if r.State != ledger.StateUsageUnknown {
		t.Fatalf("work past its execution limit: %s, want USAGE_UNKNOWN", r.State)
	}
	// It waits for a receipt from when the worker marked it, not from its start.
	if !r.UnknownAt.Equal(clk.Now()) || r.StartedAt.Equal(r.UnknownAt) {
		t.Fatalf("marked by the worker at %s: unknown-at %s, started %s", clk.Now(), r.UnknownAt, r.StartedAt)
	}
	// Unknown usage stays reserved until the operation receipt settles it.
	accounts, _ := e.Accounts(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if accounts[0].Balances[0].Reserved != 300 {
		t.Fatalf("USAGE_UNKNOWN released its hold: %+v", accounts[0].Balances[0])
	}
	res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindSettle, ReservationID: "rl-run", OperationID: "op-1", Units: ledger.Amounts{120}})
	if err != nil || res.Err != nil || res.Refunded[0] != 180 {
		t.Fatalf("settle with the operation receipt: %v %+v", err, res)
	}
	auditClean(t, e)
}

func TestAccountsShowRefillDueNow(t *testing.T) {
	clk := newClock()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 1000, time.Minute, 0)
	for _, c := range []ledger.Command{
		reserveCmd("rl-1", 600),
		{Kind: ledger.KindStart, ReservationID: "rl-1", OperationID: "op-1"},
		{Kind: ledger.KindSettle, ReservationID: "rl-1", OperationID: "op-1", Units: ledger.Amounts{600}},
	} {
		if res, err := e.Do(ctx, c); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	clk.Advance(5 * time.Second) // 10 tokens a second
	accounts, err := e.Accounts(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	if got := accounts[0].Balances[0].Available; got != 450 {
		t.Fatalf("available %d five seconds after spending 600 of 1000 at 10/s, want 450", got)
	}
}

// Concurrent gateways over the real group-commit path: the seed's opening
// scenario at scale. Whatever the interleaving, admitted units never exceed
// capacity and the audit is clean.
func TestConcurrentGatewaysNeverOversell(t *testing.T) {
	e := New(memstore.New(), Options{DisableWorkers: true})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 1000, time.Minute, 0)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				res, err := e.Do(ctx, reserveCmd(fmt.Sprintf("gw%d-%d", g, i), 600))
				if err != nil {
					t.Error(err)
					return
				}
				if res.Err == nil && !res.Replayed {
					admitted.Add(600)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() > 1000+10*60 { // burst plus at most a minute of refill
		t.Fatalf("admitted %d units against a burst of 1000", admitted.Load())
	}
	if admitted.Load() == 0 {
		t.Fatal("nothing admitted")
	}
	auditClean(t, e)
}

// TestCloseWaitsForABatchACallerRuns: a caller that finds the engine idle
// runs its batch on its own goroutine; Close waits for that batch, whose
// caller gets its durable result, and later commands fail with ErrClosed.
func TestCloseWaitsForABatchACallerRuns(t *testing.T) {
	gated := &gatedStore{Store: memstore.New(), gate: make(chan struct{})}
	e := New(gated, Options{DisableWorkers: true})
	published := make(chan struct{})
	go func() { publish(t, e, 1000, time.Minute, 0); close(published) }()
	for gated.begins.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { e.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a batch was still running")
	case <-time.After(20 * time.Millisecond):
	}
	close(gated.gate)
	<-published // publish fails the test unless its result is durable
	<-closed
	if _, err := e.Do(context.Background(), reserveCmd("rl-1", 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
	if p, err := gated.PolicyList(context.Background()); err != nil || len(p) != 1 {
		t.Fatalf("the batch that ran during Close is not in the store: %v %v", p, err)
	}
}

// beginRefusingStore refuses every Begin while refuse is set: a database
// that refuses the connection before any statement is sent.
type beginRefusingStore struct {
	store.Store
	refuse atomic.Bool
}

func (s *beginRefusingStore) Begin(ctx context.Context) (store.Tx, error) {
	if s.refuse.Load() {
		return nil, fmt.Errorf("begin: %w: connection refused", store.ErrUnavailable)
	}
	return s.Store.Begin(ctx)
}

// A batch that failed before its COMMIT was sent is marked ErrNotApplied
// (nothing of it is in the store); one whose COMMIT failed otherwise is
// not (it may have committed: TestLostCommitAckConvergesOnRetryWithSameID,
// and a commit error that is not a conflict below).
func TestNotAppliedMarksFailuresBeforeCommit(t *testing.T) {
	ms := memstore.New()
	refusing := &beginRefusingStore{Store: ms}
	e := New(refusing, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	refusing.refuse.Store(true)
	if _, err := e.Do(context.Background(), reserveCmd("rl-1", 600)); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, ErrNotApplied) {
		t.Fatalf("a refused BEGIN: %v, want unavailable and not applied", err)
	} else if strings.Count(err.Error(), "begin") != 1 {
		t.Fatalf("a refused BEGIN: %q names the step other than once", err)
	}
	refusing.refuse.Store(false)
	if _, err := e.Reservation(context.Background(), "rl-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a batch marked not applied left its reservation: %v", err)
	}
	ms.FailNextCommit(fmt.Errorf("%w: I/O error during COMMIT", store.ErrUnavailable))
	if _, err := e.Do(context.Background(), reserveCmd("rl-2", 600)); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, ErrNotApplied) {
		t.Fatalf("a failed COMMIT: %v, want unavailable with the outcome unknown", err)
	} else if strings.Count(err.Error(), "commit") != 1 {
		t.Fatalf("a failed COMMIT: %q names the step other than once", err)
	}
}
