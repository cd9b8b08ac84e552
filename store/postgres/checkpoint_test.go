package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/logcapture"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// cpAccounts returns n checkpoint accounts of a page, keyed from prefix.
func cpAccounts(prefix string, n int) []ledger.CheckpointAccount {
	out := make([]ledger.CheckpointAccount, n)
	for i := range out {
		out[i] = ledger.CheckpointAccount{
			Account: ledger.AccountKey{Subject: fmt.Sprintf("%s-%05d", prefix, i), Route: "r", Region: "g", Generation: 1},
			Entries: int64(i), Journal: "j",
		}
	}
	return out
}

// cpHeader is checkpoint seq's header following the one of seq-1.
func cpHeader(seq int64) *ledger.Checkpoint {
	prev := ""
	if seq > 1 {
		prev = fmt.Sprintf("digest-%d", seq-1)
	}
	return &ledger.Checkpoint{Seq: seq, Through: seq * 10, CutAt: time.Date(2026, 7, 22, int(seq%24), 0, 0, 0, time.UTC),
		Prev: prev, AccountsDigest: "accounts", Digest: fmt.Sprintf("digest-%d", seq)}
}

// cpRows counts checkpoint seq's account rows, staged or stored.
func cpRows(t *testing.T, s *postgres.Store, seq int64) int {
	t.Helper()
	var n int
	if err := postgres.PoolOf(s).QueryRow(context.Background(), `SELECT count(*) FROM checkpoint_accounts WHERE seq = $1`, seq).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func openMore(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// cut writes checkpoint seq whole through s: pages of accounts, the
// header, Close.
func cut(ctx context.Context, s *postgres.Store, seq int64, pages int) error {
	w, err := s.CheckpointWrite(ctx, seq)
	if err != nil {
		return err
	}
	defer w.Close()
	for p := range pages {
		if err := w.Put(ctx, cpAccounts(fmt.Sprintf("p%d", p), 50)); err != nil {
			return err
		}
	}
	return w.Finish(ctx, cpHeader(seq))
}

// One checkpoint writer at a time: a second one, on the same store or on
// another replica's pool, is refused with ErrConflict while the first
// holds the checkpoint lease, and takes it at once after Close.
func TestCheckpointLeaseOneWriter(t *testing.T) {
	ctx := context.Background()
	a, dsn := openStore(t)
	b := openMore(t, dsn)
	w, err := a.CheckpointWrite(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*postgres.Store{a, b} {
		if w2, err := s.CheckpointWrite(ctx, 1); !errors.Is(err, store.ErrConflict) {
			if w2 != nil {
				w2.Close()
			}
			t.Fatalf("a second writer beside an open one: %v, want ErrConflict", err)
		}
	}
	if err := w.Put(ctx, cpAccounts("a", 10)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w, err = b.CheckpointWrite(ctx, 1)
	if err != nil {
		t.Fatalf("a writer after the first closed: %v", err)
	}
	w.Close()
}

// A writer whose lease lapsed and was taken over by another is fenced:
// its next Put and its Finish are refused with ErrConflict and write
// nothing, and its Close leaves the new holder's lease alone.
func TestCheckpointLeaseTakenOverIsFenced(t *testing.T) {
	ctx := context.Background()
	slow, dsn := openStore(t)
	const ttl = 300 * time.Millisecond
	postgres.SetCheckpointLeaseTTL(slow, ttl)
	other := openMore(t, dsn)

	w, err := slow.CheckpointWrite(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Put(ctx, cpAccounts("before", 20)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 200*time.Millisecond)
	w2, err := other.CheckpointWrite(ctx, 1)
	if err != nil {
		t.Fatalf("taking a lapsed checkpoint lease over: %v", err)
	}
	defer w2.Close()
	if n := cpRows(t, slow, 1); n != 0 {
		t.Fatalf("the new writer left %d rows of the lapsed one", n)
	}
	if err := w.Put(ctx, cpAccounts("after", 20)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Put by a writer whose lease was taken over: %v, want ErrConflict", err)
	}
	if err := w.Finish(ctx, cpHeader(1)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Finish by a writer whose lease was taken over: %v, want ErrConflict", err)
	}
	if n := cpRows(t, slow, 1); n != 0 {
		t.Fatalf("the fenced writer inserted %d rows", n)
	}
	if _, ok, err := slow.CheckpointLast(ctx); err != nil || ok {
		t.Fatalf("a fenced writer's header is stored: %v, %v", ok, err)
	}
	w.Close()
	if w3, err := slow.CheckpointWrite(ctx, 1); !errors.Is(err, store.ErrConflict) {
		if w3 != nil {
			w3.Close()
		}
		t.Fatalf("the fenced writer's Close released the new holder's lease: %v", err)
	}
	if err := w2.Put(ctx, cpAccounts("new", 20)); err != nil {
		t.Fatal(err)
	}
	if err := w2.Finish(ctx, cpHeader(1)); err != nil {
		t.Fatal(err)
	}
	if n := cpRows(t, slow, 1); n != 20 {
		t.Fatalf("checkpoint 1 has %d rows, want the new writer's 20", n)
	}
}

// The checkpoint lease is no session's: after a writer finished and
// closed, a writer on another pool takes it at once; after a writer's
// connections were terminated without Close (a crash), the lease stands
// until its TTL and the next writer takes it then.
func TestCheckpointLeaseIsNotASession(t *testing.T) {
	ctx := context.Background()
	first, dsn := openStore(t)
	if err := cut(ctx, first, 1, 2); err != nil {
		t.Fatal(err)
	}
	second := openMore(t, dsn)
	w, err := second.CheckpointWrite(ctx, 2)
	if err != nil {
		t.Fatalf("a writer on another pool after the first closed: %v", err)
	}
	w.Close()

	var random [4]byte
	rand.Read(random[:])
	app := "capledger-crashed-" + hex.EncodeToString(random[:])
	crashed := openMore(t, withParam(t, dsn, "application_name", app))
	const ttl = 2 * time.Second
	postgres.SetCheckpointLeaseTTL(crashed, ttl)
	w, err = crashed.CheckpointWrite(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close) // before crashed's pool closes
	if err := w.Put(ctx, cpAccounts("crashed", 30)); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	replicatest.Admin(t, serverDSN(t), fmt.Sprintf(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '%s'`, app))
	if w2, err := second.CheckpointWrite(ctx, 2); !errors.Is(err, store.ErrConflict) {
		if w2 != nil {
			w2.Close()
		}
		t.Fatalf("a writer right after another's connections died: %v, want ErrConflict until the lease lapses", err)
	}
	for {
		w2, err := second.CheckpointWrite(ctx, 2)
		if err == nil {
			if since := time.Since(killed); since < ttl-500*time.Millisecond {
				t.Fatalf("the crashed writer's lease was taken after %v, before its TTL %v", since, ttl)
			}
			if n := cpRows(t, second, 2); n != 0 {
				t.Fatalf("the crashed writer's %d staged rows are left", n)
			}
			w2.Close()
			break
		}
		if !errors.Is(err, store.ErrConflict) {
			t.Fatal(err)
		}
		if time.Since(killed) > ttl+10*time.Second {
			t.Fatalf("the crashed writer's lease still held %v after its connections died (TTL %v)", time.Since(killed), ttl)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pgbouncer runs PgBouncer in transaction mode on a private port in
// front of the test server, its server connections set to schema (and
// running serverSetup, e.g. "SET lock_timeout = 5000", when not empty),
// and returns a DSN for it in pgx's default query exec mode. It drops
// the session settings the store sends (ignore_startup_parameters). The
// test is skipped without a pgbouncer binary.
func pgbouncer(t *testing.T, schema, serverSetup string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		t.Skip("pgbouncer is not installed")
	}
	u, err := url.Parse(serverDSN(t))
	if err != nil || u.Scheme != "postgres" && u.Scheme != "postgresql" {
		t.Skipf("%s is not a postgres:// URL", envDSN)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	user := u.User.Username()
	dir, err := os.MkdirTemp("", "capledger-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Readable by the user pgbouncer drops to when run as root.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := replicatest.FreeAddr(t)
	_, listenPort, _ := net.SplitHostPort(addr)
	connectQuery := "SET search_path TO " + schema
	if serverSetup != "" {
		connectQuery += "; " + serverSetup
	}
	ini := fmt.Sprintf(`[databases]
capledger = host=%s port=%s dbname=%s user=%s connect_query='%s'
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = lock_timeout,idle_in_transaction_session_timeout,plan_cache_mode,search_path
`, host, port, strings.TrimPrefix(u.Path, "/"), user, connectQuery, listenPort)
	cfg := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(cfg, []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{cfg}
	if os.Geteuid() == 0 {
		args = []string{"-u", "nobody", cfg}
	}
	cmd := exec.Command(bin, args...)
	childproc.DieWithParent(cmd)
	var logs logcapture.Logs
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("pgbouncer:\n%s", logs.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer not listening on %s: %v\n%s", addr, err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Sprintf("postgres://%s@%s/capledger?sslmode=disable", user, addr)
}

// Behind PgBouncer in transaction mode, where each transaction runs on
// whichever server connection is free, checkpoints are cut one after the
// other while many other transactions interleave on the same server
// connections: every cut gets the lease (a session advisory lock was
// left held by the server connection its unlock did not run on, and
// every later cut was refused).
func TestCheckpointBehindPgBouncer(t *testing.T) {
	direct, dsn := openStore(t) // creates the schema's tables
	_ = direct
	u, _ := url.Parse(dsn)
	schema := u.Query().Get("search_path")
	s := openMore(t, pgbouncer(t, schema, "")+"&default_query_exec_mode=exec")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var busyErr error
	var once sync.Once
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				err := pgx.BeginFunc(ctx, postgres.PoolOf(s), func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `SELECT pg_sleep(0.001), count(*) FROM checkpoints`)
					return err
				})
				if err != nil && ctx.Err() == nil {
					once.Do(func() { busyErr = err })
					return
				}
			}
		}()
	}
	const cuts = 12
	for seq := int64(1); seq <= cuts; seq++ {
		if err := cut(context.Background(), s, seq, 3); err != nil {
			cancel()
			wg.Wait()
			t.Fatalf("cut %d of %d behind PgBouncer: %v", seq, cuts, err)
		}
	}
	cancel()
	wg.Wait()
	if busyErr != nil {
		t.Fatalf("a concurrent transaction behind PgBouncer: %v", busyErr)
	}
	last, ok, err := direct.CheckpointLast(context.Background())
	if err != nil || !ok || last.Seq != cuts {
		t.Fatalf("last checkpoint %+v, %v, %v; want %d", last, ok, err, cuts)
	}
}

// A compaction worker whose cuts are refused pass after pass, because
// another writer holds the checkpoint lease, says so in its log (it was
// silent: compaction stopped without a word), and says once that it
// recovered when the lease is free and its cut goes through.
func TestCompactionLogsAHeldCheckpointLease(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t)
	if lease, err := s.LeaseAcquire(ctx, "checkpoint", "another-writer", time.Hour); err != nil || !lease.Held {
		t.Fatalf("hold the checkpoint lease: %+v, %v", lease, err)
	}
	logger, logs := logcapture.New()
	e := engine.New(s, engine.Options{
		Logger:     logger,
		Compaction: &engine.CompactionOptions{Every: time.Hour, Interval: 50 * time.Millisecond},
	})
	defer e.Close()
	k := subjectKey(1)
	if _, err := e.DoBatch(ctx, []ledger.Command{publishCmd(k, 1000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DoBatch(ctx, []ledger.Command{reserveOn(k, "r1", 10)}); err != nil {
		t.Fatal(err)
	}
	waitLog := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), what); {
			if time.Now().After(deadline) {
				t.Fatalf("no log line %q after 20s; stats %+v; log:\n%s", what, e.CompactionStats(), logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitLog("compaction: checkpoint refused pass after pass")
	if n := e.CompactionStats().Checkpoints; n != 0 {
		t.Fatalf("%d checkpoints cut while another writer held the lease", n)
	}
	if err := s.LeaseRelease(ctx, "checkpoint", "another-writer"); err != nil {
		t.Fatal(err)
	}
	waitLog("recovered")
	if n := e.CompactionStats().Checkpoints; n != 1 {
		t.Fatalf("%d checkpoints cut once the lease was free, want 1", n)
	}
}
