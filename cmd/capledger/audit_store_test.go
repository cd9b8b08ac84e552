package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

// `capledger audit --data-dir` audits a SQLite data directory, and a
// backup file, without a server: a sound ledger exits 0 with the
// report, an account changed behind the journal's back exits 6 naming
// it, and the database file is the same byte for byte afterwards.
func TestAuditDataDirWithoutServer(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	db := filepath.Join(dir, open.DefaultFile)
	withSQLite(t, db, fillLedger)

	report := auditBinary(t, bin, exitOK, "--data-dir", dir)
	if len(report.Discrepancies) != 0 || report.CheckedAt == "" {
		t.Fatalf("a sound data dir: %+v", report)
	}

	withSQLite(t, db, plantBehindTheJournal)
	before := fileHash(t, db)
	report = auditBinary(t, bin, exitDiscrepancies, "--data-dir", dir, "--since-checkpoint")
	wantJournalReplay(t, report)
	report = auditBinary(t, bin, exitDiscrepancies, "--data-dir", dir)
	wantJournalReplay(t, report)
	if after := fileHash(t, db); after != before {
		t.Fatalf("the audit changed %s", db)
	}

	// A backup as OPERATIONS.md makes one: a single file, audited
	// before it is restored.
	backup := filepath.Join(t.TempDir(), "capledger.db")
	execSQL(t, db, "VACUUM INTO '"+backup+"'")
	before = fileHash(t, backup)
	report = auditBinary(t, bin, exitDiscrepancies, "--data-dir", backup)
	wantJournalReplay(t, report)
	if after := fileHash(t, backup); after != before {
		t.Fatalf("the audit changed the backup %s", backup)
	}
	// SQLite may leave a WAL beside a file it read, but an empty one:
	// nothing a restore could replay onto the copy.
	for _, path := range []string{db + "-wal", backup + "-wal"} {
		if fi, err := os.Stat(path); err == nil && fi.Size() != 0 {
			t.Fatalf("%s holds %d bytes after the audit", path, fi.Size())
		}
	}

	// --addr asks a server: beside --data-dir it is a usage error.
	out, code := runBinary(t, bin, "audit", "--data-dir", dir, "--addr", "http://127.0.0.1:1")
	if code != exitUsage || !strings.Contains(out, "--addr") {
		t.Fatalf("audit --data-dir --addr: exit %d, %s", code, out)
	}
	// A directory without a database is an error, and stays empty.
	empty := t.TempDir()
	out, code = runBinary(t, bin, "audit", "--data-dir", empty)
	if entries, _ := os.ReadDir(empty); code != exitUsage || len(entries) != 0 {
		t.Fatalf("audit of an empty dir: exit %d, %d files made, %s", code, len(entries), out)
	}
}

// A store whose schema is not the binary's is refused, exit 1, saying
// which way it differs, and left as it was: the audit does not migrate.
func TestAuditDataDirRefusesAnotherSchema(t *testing.T) {
	bin := buildBinary(t)
	for _, c := range []struct {
		name, change, want string
	}{
		{"newer", fmt.Sprintf("INSERT INTO schema_migrations (version, name) VALUES (%d, 'from the future')", sqlite.SchemaVersion()+1), "newer"},
		{"older", fmt.Sprintf("DELETE FROM schema_migrations WHERE version = %d", sqlite.SchemaVersion()), "older"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, open.DefaultFile)
			withSQLite(t, db, fillLedger)
			execSQL(t, db, c.change)
			before := fileHash(t, db)
			out, code := runBinary(t, bin, "audit", "--data-dir", dir)
			if code != exitUsage || !strings.Contains(out, c.want) || !strings.Contains(out, "schema version") {
				t.Fatalf("audit of a %s schema: exit %d, %s", c.name, code, out)
			}
			if after := fileHash(t, db); after != before {
				t.Fatalf("the refused audit changed %s", db)
			}
		})
	}
}

// `capledger audit --store postgres://...` audits the PostgreSQL store
// with no replica running: sound exits 0, planted exits 6 naming it; a
// schema a newer binary migrated is refused and left as it was.
func TestAuditPostgresWithoutServer(t *testing.T) {
	dsn := postgresSchema(t)
	bin := buildBinary(t)
	ctx := context.Background()
	withStore := func(f func(*testing.T, store.Store)) {
		st, err := postgres.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		f(t, st)
	}
	withStore(fillLedger)
	report := auditBinary(t, bin, exitOK, "--store", dsn)
	if len(report.Discrepancies) != 0 {
		t.Fatalf("a sound store: %+v", report)
	}
	withStore(plantBehindTheJournal)
	wantJournalReplay(t, auditBinary(t, bin, exitDiscrepancies, "--store", dsn))
	wantJournalReplay(t, auditBinary(t, bin, exitDiscrepancies, "--store", dsn, "--since-checkpoint"))

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, 'from the future')", postgres.SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	out, code := runBinary(t, bin, "audit", "--store", dsn)
	if code != exitUsage || !strings.Contains(out, "newer capledger") {
		t.Fatalf("audit of a newer schema: exit %d, %s", code, out)
	}
}

// auditReport is the part of an audit's JSON report the tests read.
type auditReport struct {
	CheckedAt     string `json:"checkedAt"`
	Discrepancies []struct {
		Check, Account, Detail string
	} `json:"discrepancies"`
}

// auditBinary runs the built binary's `audit` with args and no server
// to ask (CAPLEDGER_ADDR unset), wants exit code want and returns the
// report it printed.
func auditBinary(t *testing.T, bin string, want int, args ...string) auditReport {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"audit", "--progress"}, args...)...)
	cmd.Env = withoutAddr()
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != want {
		t.Fatalf("audit %v: exit %d, want %d\nstdout %s\nstderr %s", args, code, want, stdout.String(), stderr.String())
	}
	var r auditReport
	if err := json.Unmarshal([]byte(stdout.String()), &r); err != nil {
		t.Fatalf("audit %v printed %q: %v", args, stdout.String(), err)
	}
	if !strings.Contains(stderr.String(), "100%") {
		t.Errorf("audit %v --progress drew no finished bar: %q", args, stderr.String())
	}
	return r
}

// runBinary runs the built binary with args and no server to ask, and
// returns its stdout and stderr together and its exit code (a command
// that is expected to refuse: it waits for the process to end).
func runBinary(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = withoutAddr()
	childproc.DieWithParent(cmd) // a serve that should have refused would outlive the test
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// cliAgainst runs the built binary with args and --addr url (no
// CAPLEDGER_ADDR from the environment), fails the test on any error or
// non-zero exit, and returns what it printed on stdout.
func cliAgainst(t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(args, "--addr", url)...)
	cmd.Env = withoutAddr()
	childproc.DieWithParent(cmd)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("capledger %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func withoutAddr() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CAPLEDGER_ADDR=") {
			env = append(env, kv)
		}
	}
	return env
}

// withSQLite opens the SQLite store at path read-write, as a server
// would, runs f on it and closes it.
func withSQLite(t *testing.T, path string, f func(*testing.T, store.Store)) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	f(t, st)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// fillLedger publishes a policy and reserves, starts and settles through
// the engine, as a server's gateways would.
func fillLedger(t *testing.T, st store.Store) {
	t.Helper()
	ctx := context.Background()
	e := engine.New(st, engine.Options{DisableWorkers: true})
	defer e.Close()
	p := ledger.Policy{
		Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: ledger.DefaultRegion},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100000, RefillUnits: 10, RefillInterval: time.Second}},
		HoldTTL:    time.Hour,
	}.WithDefaults()
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		t.Fatalf("publish: %v %v", err, res.Err)
	}
	for i := range 50 {
		id := fmt.Sprintf("r%02d", i)
		cmds := []ledger.Command{
			{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id, Subject: "tenant-7", Route: "chat.generate", Region: ledger.DefaultRegion, Units: ledger.Amounts{10}},
			{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id},
		}
		if i%2 == 0 { // half settled, half still running
			cmds = append(cmds, ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{4}})
		}
		results, err := e.DoBatch(ctx, cmds)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Err != nil {
				t.Fatalf("%s: %v", id, r.Err)
			}
		}
	}
}

// plantBehindTheJournal raises the opening and the available units of
// st's only account by one in a write of its own with no journal entry,
// as the engine's audit tests do: conservation still holds, replaying
// the journal no longer gives the account (journal_replay).
func plantBehindTheJournal(t *testing.T, st store.Store) {
	t.Helper()
	ctx := context.Background()
	accounts, err := st.AccountList(ctx, ledger.PolicyKey{})
	if err != nil || len(accounts) != 1 {
		t.Fatalf("accounts %v %v", accounts, err)
	}
	a := accounts[0]
	a.Balances[0].Opening++
	a.Balances[0].Available++
	tx, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{a}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func wantJournalReplay(t *testing.T, r auditReport) {
	t.Helper()
	if len(r.Discrepancies) == 0 || r.Discrepancies[0].Check != ledger.CheckJournal || !strings.Contains(r.Discrepancies[0].Account, "tenant-7") {
		t.Fatalf("the planted change: %+v, want %s naming tenant-7's account", r.Discrepancies, ledger.CheckJournal)
	}
}

// execSQL runs one statement on the SQLite file at path with
// database/sql, behind the store's back.
func execSQL(t *testing.T, path, stmt string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

func fileHash(t *testing.T, path string) [sha256.Size]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// A serve running on the data directory does not stop an audit of it
// (nor the audit the server): the audit reads the last commit before
// its read began, sound here, and the server goes on admitting.
func TestAuditDataDirBesideARunningServer(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte("subject: tenant-7\nroute: chat\nholdTTL: 1h\ndimensions:\n  - unit: tokens\n    burst: 6000\n"), 0o600)
	code, out, errOut := cli(t, srv.url, "policy", "publish", policy)
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, srv.url, "reserve", "--subject", "tenant-7", "--route", "chat", "--units", "tokens=100", "--id", "r1")
	wantExit(t, exitOK, code, out, errOut)

	report := auditBinary(t, bin, exitOK, "--data-dir", dir)
	if len(report.Discrepancies) != 0 {
		t.Fatalf("a live data dir: %+v", report)
	}
	code, out, errOut = cli(t, srv.url, "reserve", "--subject", "tenant-7", "--route", "chat", "--units", "tokens=100", "--id", "r2")
	wantExit(t, exitOK, code, out, errOut)
}

// A file that is not a SQLite database given to --data-dir is bad input:
// exit 1 naming the file, not 5 (a store that cannot be reached, to
// retry later). A missing path stays exit 1, and so does a SQLite file
// without capledger's tables.
func TestAuditDataDirRefusesAFileThatIsNotADatabase(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte("not a database, only notes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := fileHash(t, text)
	code, out := auditHere(t, "--data-dir", text)
	if code != exitUsage || !strings.Contains(out, text) || !strings.Contains(out, "not a SQLite database") {
		t.Fatalf("audit of a text file: exit %d, %s", code, out)
	}
	if after := fileHash(t, text); after != before {
		t.Fatalf("the refused audit changed %s", text)
	}
	code, out = auditHere(t, "--data-dir", filepath.Join(dir, "missing.db"))
	if code != exitUsage || !strings.Contains(out, "missing.db") {
		t.Fatalf("audit of a missing file: exit %d, %s", code, out)
	}
	other := filepath.Join(dir, "other.db")
	execSQL(t, other, "CREATE TABLE notes (body TEXT)")
	code, out = auditHere(t, "--data-dir", other)
	if code != exitUsage || !strings.Contains(out, "schema_migrations") {
		t.Fatalf("audit of a SQLite file without capledger's tables: exit %d, %s", code, out)
	}
}

// auditHere runs `capledger audit args...` in this process, with no
// server to ask, and returns its exit code and what it printed.
func auditHere(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out strings.Builder
	e := &env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}
	code := run(context.Background(), e, append([]string{"audit", "--progress=false"}, args...))
	return code, out.String()
}

// `capledger audit --store sqlite` reads the store `capledger serve
// --store sqlite` wrote: capledger.db in ./capledger-data without
// --data-dir, in --data-dir with it.
func TestAuditStoreSQLiteDefaultsToServesDataDir(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	for _, dir := range []string{"capledger-data", "other"} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	withSQLite(t, filepath.Join(work, "capledger-data", open.DefaultFile), fillLedger)
	code, out := auditHere(t, "--store", "sqlite")
	if code != exitOK || !strings.Contains(out, `"checkedAt"`) {
		t.Fatalf("audit --store sqlite beside ./capledger-data: exit %d, %s", code, out)
	}

	other := filepath.Join(work, "other")
	withSQLite(t, filepath.Join(other, open.DefaultFile), fillLedger)
	withSQLite(t, filepath.Join(other, open.DefaultFile), plantBehindTheJournal)
	code, out = auditHere(t, "--store", "sqlite", "--data-dir", other)
	if code != exitDiscrepancies || !strings.Contains(out, ledger.CheckJournal) {
		t.Fatalf("audit --store sqlite --data-dir %s: exit %d, %s", other, code, out)
	}
}

// damagedDataDir returns a data directory whose database has its
// reservations table's root page overwritten: SQLite reads it as a
// malformed page (SQLITE_CORRUPT).
func damagedDataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	db := filepath.Join(dir, open.DefaultFile)
	withSQLite(t, db, fillLedger)
	execSQL(t, db, "PRAGMA wal_checkpoint(TRUNCATE)")
	conn, err := sql.Open("sqlite", db)
	if err != nil {
		t.Fatal(err)
	}
	var root, pageSize int64
	if err := conn.QueryRow("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'reservations'").Scan(&root); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow("PRAGMA page_size").Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	f, err := os.OpenFile(db, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(strings.Repeat("\xff", int(pageSize))), (root-1)*pageSize); err != nil {
		t.Fatal(err)
	}
	f.Close()

	return dir
}

// When the audit's own read of a data dir fails (here a reservations page
// overwritten), `capledger audit --data-dir` says so naming the audit
// once: "capledger audit: snapshot reservations: ...", not "capledger
// audit: audit: ...".
func TestAuditDataDirReadFailureNamesTheAuditOnce(t *testing.T) {
	dir := damagedDataDir(t)
	code, out := auditHere(t, "--data-dir", dir)
	if code == exitOK || code == exitDiscrepancies || !strings.HasPrefix(out, "capledger audit: ") || !strings.Contains(out, "reservations") {
		t.Fatalf("audit of a data dir it cannot read: exit %d, %s", code, out)
	}
	if n := strings.Count(out, "audit: "); n != 1 {
		t.Fatalf("%q names the audit %d times, want once (the command's name)", out, n)
	}
}

// A damaged page is not fixed by retrying: the audit exits 1, as for a
// file that is not a database (OPERATIONS.md, auditing without a
// server), not 5 (store unavailable), which scripts retry.
func TestAuditDataDirDamagedPageExitsNotUnavailable(t *testing.T) {
	code, out := auditHere(t, "--data-dir", damagedDataDir(t))
	if code != exitUsage || !strings.Contains(out, "malformed") {
		t.Fatalf("audit of a damaged page: exit %d, want %d naming it malformed: %s", code, exitUsage, out)
	}
}
