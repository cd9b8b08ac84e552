package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

var (
	t0      = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	tenant7 = ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
)

// seedPolicy is the seed's: 1,000 tokens of burst, refilled slowly.
func seedPolicy() *ledger.Policy {
	p := ledger.Policy{
		Key:        tenant7,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Minute, MaxOverdraft: 500}},
		HoldTTL:    30 * time.Second,
	}.WithDefaults()
	return &p
}

func reserveCmd(id string, units int64) ledger.Command {
	return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
		Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: ledger.Amounts{units}}
}

// commitCmds runs cmds as one batch through the engine's core.
func commitCmds(t testing.TB, s store.Store, now time.Time, cmds ...ledger.Command) []ledger.Result {
	t.Helper()
	results, err := engine.NewCore(s).Commit(context.Background(), cmds, now)
	if err != nil {
		t.Fatalf("commit %d commands: %v", len(cmds), err)
	}
	return results
}

func publish(t testing.TB, s store.Store) uint64 {
	t.Helper()
	res := commitCmds(t, s, t0, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: seedPolicy()})
	if res[0].Err != nil {
		t.Fatalf("publish: %v", res[0].Err)
	}
	return res[0].Generation
}

func mustAudit(t *testing.T, s store.Store) *ledger.Snapshot {
	t.Helper()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ledger.Audit(snap) {
		t.Errorf("audit: %s", d)
	}
	return snap
}

func account(t *testing.T, s store.Store, generation uint64) ledger.Account {
	t.Helper()
	a, err := s.AccountGet(context.Background(), ledger.AccountKey{Subject: tenant7.Subject, Route: tenant7.Route,
		Region: tenant7.Region, Generation: generation})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A COMMIT whose answer is lost after the server committed is reported as
// store.ErrUnavailable (never success, never a clean conflict), and the
// retry with the same reservation id replays the receipt instead of
// debiting twice.
func TestCommitAnswerLostIsUnavailableAndRetryConverges(t *testing.T) {
	dsn := schemaDSN(t)
	proxy := newCommitCutter(t, targetOf(t, dsn))
	s, err := postgres.Open(context.Background(), proxy.dsnVia(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := publish(t, s)

	proxy.armed.Store(true)
	_, err = engine.NewCore(s).Commit(context.Background(), []ledger.Command{reserveCmd("rl-lost-ack", 600)}, t0)
	if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrConflict) {
		t.Fatalf("commit with its answer lost: err %v, want store.ErrUnavailable only", err)
	}
	if proxy.cuts.Load() != 1 {
		t.Fatalf("proxy cut %d commits, want 1", proxy.cuts.Load())
	}
	if st := s.Stats(); st.CommitUnknown != 1 {
		t.Errorf("stats: CommitUnknown %d, want 1", st.CommitUnknown)
	}
	// The server did commit: the reservation is there.
	if _, err := s.ReservationGet(context.Background(), "rl-lost-ack"); err != nil {
		t.Fatalf("reservation after the lost answer: %v (the proxy cuts only after the server answered)", err)
	}
	res := commitCmds(t, s, t0.Add(time.Second), reserveCmd("rl-lost-ack", 600))
	if res[0].Err != nil || !res[0].Replayed || res[0].Reservation.State != ledger.StateReserved {
		t.Fatalf("retry: %+v, want a replay of the RESERVED receipt", res[0])
	}
	a := account(t, s, g)
	if a.Balances[0].Reserved != 600 || a.Balances[0].Available != 400 {
		t.Fatalf("after retry: available %d reserved %d, want 400 / 600 (debited once)", a.Balances[0].Available, a.Balances[0].Reserved)
	}
	mustAudit(t, s)
}

// A backend terminated right before COMMIT (pg_terminate_backend from
// another connection, as an operator or a failover would) is reported as
// store.ErrUnavailable; nothing of the transaction is visible and the
// retry with the same ids applies it once.
func TestBackendTerminatedBeforeCommitIsUnavailable(t *testing.T) {
	dsn := schemaDSN(t)
	app := fmt.Sprintf("capledger_test_%d", time.Now().UnixNano())
	s, err := postgres.Open(context.Background(), withParam(t, dsn, "application_name", app))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := publish(t, s)
	ctx := context.Background()

	write := func() (store.Tx, error) {
		tx, err := s.Begin(ctx)
		if err != nil {
			return nil, err
		}
		a, err := tx.AccountGet(ctx, ledger.AccountKey{Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Generation: g})
		if err != nil {
			// The account opens with the first reserve; open it here.
			a = &ledger.Account{Key: ledger.AccountKey{Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Generation: g},
				Dims: 1, Balances: ledger.Balances{{Opening: 1000, Available: 1000}}, EpochStart: t0}
		}
		if _, err := tx.ReservationGet(ctx, "rl-killed"); !errors.Is(err, store.ErrNotFound) {
			tx.Rollback(ctx)
			return nil, fmt.Errorf("reservation before: %v", err)
		}
		a.Balances[0].Available -= 600
		a.Balances[0].Reserved += 600
		a.Version++
		r := ledger.Reservation{ID: "rl-killed", RequestDigest: "sha256:k", Account: a.Key, AccountingEpoch: t0,
			Reserved: ledger.Amounts{600}, State: ledger.StateReserved, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}
		return tx, tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{*a}, Reservations: []ledger.Reservation{r},
			NewReservations: map[string]bool{r.ID: true}})
	}
	tx, err := write()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	conn, err := pgx.Connect(ctx, serverDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND state = 'idle in transaction') k`, app).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d backends (%v), want the transaction's one", killed, err)
	}
	err = tx.Commit(ctx)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("commit on a terminated backend: err %v, want store.ErrUnavailable", err)
	}
	tx.Rollback(ctx)
	if _, err := s.ReservationGet(ctx, "rl-killed"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("reservation of the killed transaction: %v, want not found", err)
	}
	// The pool replaced the dead connection; the retry applies once.
	tx, err = write()
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("retry: %v", err)
	}
	r, err := s.ReservationGet(ctx, "rl-killed")
	if err != nil || r.State != ledger.StateReserved {
		t.Fatalf("after retry: %+v, %v", r, err)
	}
}

// Two transactions that lock two accounts in opposite orders: the one that
// asks for a row out of the fixed order while another transaction holds
// it is refused at once with store.ErrConflict, instead of both waiting
// for PostgreSQL's deadlock detector.
func TestOutOfOrderLockIsRefusedNotDeadlocked(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	keyA := ledger.AccountKey{Subject: "a-tenant", Route: "r", Region: "eu", Generation: 1}
	keyB := ledger.AccountKey{Subject: "b-tenant", Route: "r", Region: "eu", Generation: 1}
	var seed []ledger.Account
	for _, k := range []ledger.AccountKey{keyA, keyB} {
		seed = append(seed, ledger.Account{Key: k, Dims: 1, Balances: ledger.Balances{{Opening: 10, Available: 10}}, EpochStart: t0})
	}
	commitChanges(t, s, &store.Changes{Accounts: seed})

	holdsB, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holdsB.Rollback(ctx)
	if _, err := holdsB.AccountGet(ctx, keyB); err != nil {
		t.Fatal(err)
	}
	holdsA, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holdsA.Rollback(ctx)
	if _, err := holdsA.AccountGet(ctx, keyA); err != nil {
		t.Fatal(err)
	}
	// holdsA asks for B, in order: it waits for holdsB.
	waited := make(chan error, 1)
	go func() {
		_, err := holdsA.AccountGet(ctx, keyB)
		waited <- err
	}()
	// holdsB asks for A, out of order, while holdsA holds it: refused.
	_, err = holdsB.AccountGet(ctx, keyA)
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("out-of-order lock of a held row: err %v, want store.ErrConflict", err)
	}
	holdsB.Rollback(ctx)
	if err := <-waited; err != nil {
		t.Fatalf("in-order lock after the holder rolled back: %v", err)
	}
	st := s.Stats()
	if st.Deadlocks != 0 || st.LockNotAvailable != 1 || st.Conflicts != 1 {
		t.Errorf("stats %+v: want one refused lock and no deadlock", st)
	}
	// Out of order but free: granted (only a held row makes it wait).
	if _, err := holdsA.AccountGet(ctx, ledger.AccountKey{Subject: "0-first", Route: "r", Region: "eu", Generation: 1}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("absent row out of order: %v", err)
	}
}

func commitChanges(t *testing.T, s store.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, c); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// Two transactions that both found an account absent and both create it:
// the second is store.ErrDuplicate, never a silent overwrite of the first
// creator's balances.
func TestConcurrentCreateIsDuplicateNotOverwrite(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	key := ledger.AccountKey{Subject: "new", Route: "r", Region: "eu", Generation: 1}
	begin := func() store.Tx {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.AccountGet(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("account before: %v", err)
		}
		return tx
	}
	first, second := begin(), begin()
	defer first.Rollback(ctx)
	defer second.Rollback(ctx)
	mk := func(units int64) *store.Changes {
		return &store.Changes{Accounts: []ledger.Account{{Key: key, Dims: 1, EpochStart: t0,
			Balances: ledger.Balances{{Opening: units, Available: units}}}}}
	}
	if err := first.Write(ctx, mk(100)); err != nil {
		t.Fatal(err)
	}
	secondDone := make(chan error, 1)
	go func() { secondDone <- second.Write(ctx, mk(999)) }() // waits on the unique index
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-secondDone; !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("second creator: err %v, want store.ErrDuplicate", err)
	}
	if a, err := s.AccountGet(ctx, key); err != nil || a.Balances[0].Opening != 100 {
		t.Fatalf("account: %+v, %v; want the first creator's", a.Balances[0], err)
	}
}

// The database refuses what the ledger must never write: a negative term,
// an account that does not balance, a negative reservation amount. Each is
// an error that is neither a conflict nor unavailability (retrying cannot
// help), counted in Stats.
func TestDatabaseRefusesBrokenInvariants(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	key := ledger.AccountKey{Subject: "t", Route: "r", Region: "eu", Generation: 1}
	good := ledger.Account{Key: key, Dims: 2, EpochStart: t0,
		Balances: ledger.Balances{{Opening: 10, Available: 10}, {Opening: 5, Available: 5}}}
	commitChanges(t, s, &store.Changes{Accounts: []ledger.Account{good}})

	negative := good
	negative.Balances[1].Available, negative.Balances[1].Reserved = -1, 6
	unbalanced := good
	unbalanced.Balances[0].Available = 11
	overRepaid := good
	overRepaid.Balances[0].OverdraftRepaid, overRepaid.Balances[0].Minted = 1, 1
	badReservation := ledger.Reservation{ID: "rl-neg", Account: key, Reserved: ledger.Amounts{5, -1}, State: ledger.StateReserved}
	cases := []struct {
		name string
		c    *store.Changes
	}{
		{"negative available", &store.Changes{Accounts: []ledger.Account{negative}}},
		{"unbalanced account", &store.Changes{Accounts: []ledger.Account{unbalanced}}},
		{"repaid more than issued", &store.Changes{Accounts: []ledger.Account{overRepaid}}},
		{"negative reservation amount", &store.Changes{Reservations: []ledger.Reservation{badReservation},
			NewReservations: map[string]bool{"rl-neg": true}}},
	}
	for i, tc := range cases {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = tx.Write(ctx, tc.c)
		tx.Rollback(ctx)
		if err == nil || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrDuplicate) {
			t.Errorf("%s: err %v, want a refused CHECK", tc.name, err)
		}
		if got := s.Stats().CheckViolations; got != uint64(i+1) {
			t.Errorf("%s: CheckViolations %d, want %d", tc.name, got, i+1)
		}
	}
	if a, err := s.AccountGet(ctx, key); err != nil || a.Balances != good.Balances {
		t.Fatalf("account after refused writes: %+v, %v", a.Balances, err)
	}
}

// Replicas starting at once on an empty schema all open; the migrations
// ran exactly once; Migrate afterwards has nothing to do.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dsn := schemaDSN(t)
	ctx := context.Background()
	const replicas = 6
	var wg sync.WaitGroup
	errs := make([]error, replicas)
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := postgres.Open(ctx, dsn)
			if err == nil {
				err = s.Ping(ctx)
				s.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	ran, err := postgres.Migrate(ctx, dsn)
	if err != nil || len(ran) != 0 {
		t.Fatalf("migrate on a current schema: ran %v, %v", ran, err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	var want []int32
	for v := 1; v <= postgres.SchemaVersion(); v++ {
		want = append(want, int32(v))
	}
	if !slices.Equal(versions, want) {
		t.Fatalf("schema_migrations %v, want %v", versions, want)
	}

	// A schema migrated by a newer binary is refused with a clear error.
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_the_future')`, postgres.SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	if s, err := postgres.Open(ctx, dsn); err == nil {
		s.Close()
		t.Fatal("open on a schema newer than the binary succeeded")
	}
}

func TestMigrateFreshSchemaAppliesEverything(t *testing.T) {
	dsn := schemaDSN(t)
	ran, err := postgres.Migrate(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != postgres.SchemaVersion() || ran[0] != 1 {
		t.Fatalf("ran %v, want 1..%d", ran, postgres.SchemaVersion())
	}
}

// A search_path that names no existing schema is refused with what to do
// (OPERATIONS.md: create the schema before the first start), not with a
// driver error about scanning NULL.
func TestMigrateNamesAMissingSchema(t *testing.T) {
	dsn := withParam(t, serverDSN(t), "search_path", "capledger_test_no_such_schema")
	_, err := postgres.Migrate(context.Background(), dsn)
	if err == nil || !strings.Contains(err.Error(), "create it first") || !strings.Contains(err.Error(), "capledger_test_no_such_schema") {
		t.Fatalf("Migrate with a missing schema: %v", err)
	}
	if _, err := postgres.Open(context.Background(), dsn); err == nil || !strings.Contains(err.Error(), "create it first") {
		t.Fatalf("Open with a missing schema: %v", err)
	}
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Port 1 on loopback: nothing listens there.
	_, err := postgres.Open(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("open of an unreachable server: err %v, want store.ErrUnavailable", err)
	}
	if _, err := postgres.Open(ctx, "postgres://[::1"); err == nil || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("malformed dsn: err %v, want a plain error", err)
	}
}

// ReservationsPrefetch reads and locks a batch's reservations in one query;
// ReservationGet answers from it (stored rows, not-found for absent ids),
// the rows stay locked against other transactions, and absent ids are
// inserted by Write like any row found absent.
func TestReservationsPrefetch(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	key := ledger.AccountKey{Subject: "t", Route: "r", Region: "eu", Generation: 1}
	mk := func(id string, units int64) ledger.Reservation {
		return ledger.Reservation{ID: id, RequestDigest: "sha256:" + id, Account: key, AccountingEpoch: t0,
			Reserved: ledger.Amounts{units}, State: ledger.StateReserved, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}
	}
	r1, r2 := mk("rl-1", 10), mk("rl-2", 20)
	commitChanges(t, s, &store.Changes{
		Accounts:        []ledger.Account{{Key: key, Dims: 1, EpochStart: t0, Balances: ledger.Balances{{Opening: 100, Available: 70, Reserved: 30}}}},
		Reservations:    []ledger.Reservation{r1, r2},
		NewReservations: map[string]bool{r1.ID: true, r2.ID: true},
	})

	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	prefetcher, ok := tx.(interface {
		ReservationsPrefetch(context.Context, []string) error
	})
	if !ok {
		t.Fatal("the postgres Tx has no ReservationsPrefetch")
	}
	if err := prefetcher.ReservationsPrefetch(ctx, []string{"rl-3", "rl-2", "rl-1", "rl-2"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []ledger.Reservation{r1, r2} {
		got, err := tx.ReservationGet(ctx, want.ID)
		if err != nil || *got != want {
			t.Fatalf("prefetched %s: %+v, %v", want.ID, got, err)
		}
		got.State = ledger.StateReleased // the caller's copy
	}
	if again, _ := tx.ReservationGet(ctx, "rl-1"); again.State != ledger.StateReserved {
		t.Fatal("ReservationGet handed out the prefetched row itself, not a copy")
	}
	if _, err := tx.ReservationGet(ctx, "rl-3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("prefetched absent id: %v", err)
	}

	// Locked: another transaction that holds an account (later in the
	// lock order) is refused rl-1 at once.
	other, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.AccountGet(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ReservationGet(ctx, "rl-1"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("prefetched row read by another transaction: err %v, want store.ErrConflict (held)", err)
	}
	other.Rollback(ctx)

	// rl-3 was found absent: Write inserts it; rl-1 is updated.
	started := r1
	started.State, started.OperationID, started.StartedAt = ledger.StateStarted, "op-1", t0.Add(time.Second)
	if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{started, mk("rl-3", 5)}}); err != nil {
		t.Fatal(err)
	}
	if got, err := tx.ReservationGet(ctx, "rl-1"); err != nil || got.State != ledger.StateStarted {
		t.Fatalf("after Write the transaction reads its own write: %+v, %v", got, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReservationGet(ctx, "rl-3"); err != nil || got.Reserved[0] != 5 {
		t.Fatalf("rl-3: %+v, %v", got, err)
	}
}

// Replicas may run as a role that can only read and write the tables
// (migrations applied beforehand by the schema owner): Open on a current
// schema creates nothing, and the ledger works.
func TestOpenAsDMLOnlyRole(t *testing.T) {
	dsn := schemaDSN(t)
	if _, err := postgres.Migrate(context.Background(), dsn); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("capledger_dml_%d", time.Now().UnixNano())
	schema := mustQueryParam(t, dsn, "search_path")
	replicatest.Admin(t, dsn, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		replicatest.Admin(t, dsn, `DROP OWNED BY `+role)
		replicatest.Admin(t, dsn, `DROP ROLE `+role)
	})
	replicatest.Admin(t, dsn, `GRANT USAGE ON SCHEMA `+schema+` TO `+role+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` TO `+role+`;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA `+schema+` TO `+role)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("needs a URL DSN: %v", err)
	}
	u.User = url.User(role)
	s, err := postgres.Open(context.Background(), u.String())
	if err != nil {
		t.Fatalf("open as a DML-only role: %v", err)
	}
	defer s.Close()
	publish(t, s)
	res := commitCmds(t, s, t0, reserveCmd("rl-dml", 600))
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	mustAudit(t, s)
}

func mustQueryParam(t *testing.T, dsn, name string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Query().Get(name) == "" {
		t.Skipf("needs a URL DSN with %s", name)
	}
	return u.Query().Get(name)
}

// A server that does not accept writes (a standby; here a session forced
// read-only) is refused at connect, so a multi-host DSN moves on to the
// primary instead of settling on it.
func TestReadOnlyServerIsRefused(t *testing.T) {
	dsn := withParam(t, schemaDSN(t), "default_transaction_read_only", "on")
	_, err := postgres.Open(context.Background(), dsn)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("open on a read-only session: err %v, want store.ErrUnavailable", err)
	}
}

// An operator with large tables builds the indexes of migrations 3, 4
// and 5 beforehand with CREATE INDEX CONCURRENTLY, and adds migration 5's
// column first so its index can be built (docs/OPERATIONS.md); the
// migrations must then find them, apply without error, and keep them.
func TestIndexMigrationsAcceptPrebuiltIndexes(t *testing.T) {
	ctx := context.Background()
	dsn := schemaDSN(t)
	if _, err := postgres.Migrate(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		// Back to schema version 2.
		`DROP INDEX reservations_usage_unknown_at`,
		`DROP TRIGGER reservations_unknown_at_default ON reservations`,
		`DROP FUNCTION reservations_unknown_at_default()`,
		`ALTER TABLE reservations DROP COLUMN unknown_at`,
		`DROP INDEX account_terms_in_debt`,
		`DELETE FROM schema_migrations WHERE version IN (3, 4, 5)`,
		// What docs/OPERATIONS.md has the operator run beforehand.
		`CREATE INDEX CONCURRENTLY reservations_usage_unknown ON reservations (started_at, id) WHERE state = 8`,
		`CREATE INDEX CONCURRENTLY account_terms_in_debt ON account_terms (account_id)
			WHERE overdraft_issued > overdraft_repaid`,
		`ALTER TABLE reservations ADD COLUMN IF NOT EXISTS unknown_at bigint NOT NULL DEFAULT 0`,
		`CREATE INDEX CONCURRENTLY reservations_usage_unknown_at ON reservations (unknown_at, id) WHERE state = 8`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var builtAt int64
	if err := conn.QueryRow(ctx, `SELECT oid::bigint FROM pg_class WHERE oid = 'reservations_usage_unknown_at'::regclass`).Scan(&builtAt); err != nil {
		t.Fatal(err)
	}
	ran, err := postgres.Migrate(ctx, dsn)
	if err != nil || !slices.Equal(ran, []int{3, 4, 5}) {
		t.Fatalf("migrate over prebuilt indexes: ran %v, %v; want [3 4 5]", ran, err)
	}
	// Migration 5 kept the index built beforehand (the same object, not
	// one built again) and dropped version 3's.
	var kept int64
	if err := conn.QueryRow(ctx, `SELECT oid::bigint FROM pg_class WHERE oid = 'reservations_usage_unknown_at'::regclass`).Scan(&kept); err != nil || kept != builtAt {
		t.Fatalf("reservations_usage_unknown_at after migrating: oid %d, %v; built beforehand as %d", kept, err, builtAt)
	}
	var old *string
	if err := conn.QueryRow(ctx, `SELECT to_regclass('reservations_usage_unknown')::text`).Scan(&old); err != nil || old != nil {
		t.Fatalf("version 3's index after migration 5: %v, %v; want it dropped", old, err)
	}
}

// Migration 5 gives the USAGE_UNKNOWN rows of an older schema their start
// as the time they were marked (the best lower bound they allow), and the
// rows that binaries of an older version mark during a rolling upgrade
// (writing no unknown_at) the same; what this binary marks keeps its time.
func TestUnknownAtOfOlderSchemasAndWriters(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	publish(t, s)
	start := func(id string) ledger.Command {
		return ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id}
	}
	mark := func(id string) ledger.Command {
		return ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id}
	}
	for _, res := range commitCmds(t, s, t0, reserveCmd("rl-old", 100), reserveCmd("rl-rolling", 100), reserveCmd("rl-new", 100)) {
		if res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	commitCmds(t, s, t0.Add(time.Second), start("rl-old"), start("rl-rolling"), start("rl-new"))
	commitCmds(t, s, t0.Add(20*time.Second), mark("rl-old"))

	// Back to schema version 4: rl-old was marked by a binary that did
	// not record when.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`DROP INDEX reservations_usage_unknown_at`,
		`DROP TRIGGER reservations_unknown_at_default ON reservations`,
		`DROP FUNCTION reservations_unknown_at_default()`,
		`ALTER TABLE reservations DROP COLUMN unknown_at`,
		`CREATE INDEX reservations_usage_unknown ON reservations (started_at, id) WHERE state = 8`,
		`DELETE FROM schema_migrations WHERE version = 5`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if ran, err := postgres.Migrate(ctx, dsn); err != nil || !slices.Equal(ran, []int{5}) {
		t.Fatalf("migrate: ran %v, %v; want [5]", ran, err)
	}
	backlog, err := s.ReservationsUnknownBacklog(ctx)
	if err != nil || backlog != (store.UnknownBacklog{Count: 1, OldestMarkedAt: t0.Add(time.Second)}) {
		t.Fatalf("backlog after migration 5: %+v, %v; want rl-old marked at its start", backlog, err)
	}

	// A replica of version 4, still running, marks rl-rolling: its upsert
	// names no unknown_at. This binary marks rl-new later.
	if _, err := conn.Exec(ctx, `UPDATE reservations SET state = 8 WHERE id = 'rl-rolling'`); err != nil {
		t.Fatal(err)
	}
	commitCmds(t, s, t0.Add(time.Minute), mark("rl-new"))
	list, err := s.ReservationsUnknown(ctx, store.UnknownFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range list {
		got = append(got, fmt.Sprintf("%s@%s", r.ID, r.UnknownAt.Sub(t0)))
	}
	if want := []string{"rl-old@1s", "rl-rolling@1s", "rl-new@1m0s"}; !slices.Equal(got, want) {
		t.Fatalf("USAGE_UNKNOWN: %v, want %v", got, want)
	}
	commitCmds(t, s, t0.Add(2*time.Minute), ledger.Command{Kind: ledger.KindSettle, ReservationID: "rl-new",
		OperationID: "op-rl-new", Units: ledger.Amounts{50}})
	if r, err := s.ReservationGet(ctx, "rl-new"); err != nil || r.State != ledger.StateSettled || !r.UnknownAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("rl-new settled: %+v, %v; want its marking time kept", r, err)
	}
	mustAudit(t, s)
}
