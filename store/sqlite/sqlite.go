// Package sqlite is capledger's embedded default store: one SQLite file in
// WAL mode, through the pure-Go driver modernc.org/sqlite (no cgo).
//
// Durability: every connection runs with synchronous=FULL, so in WAL mode
// the write-ahead log is fsynced before each COMMIT returns. A transaction
// whose Commit returned nil survives a process kill and a power loss (on
// storage that honours fsync); one whose Commit did not return is either
// wholly present or wholly absent after recovery, never half-present.
// Opened WithPipelinedSync, the write connection runs synchronous=NORMAL
// and Store.Sync fsyncs the log instead (pipeline.go): Commit still
// returns only once durable, CommitDeferred leaves that to a later Sync,
// and the read methods answer only from durable commits. A failed fsync
// fails the store for good, in either mode.
//
// Concurrency: one write connection, so one writer at a time in this
// process; Begin waits for it (honouring its context) and then issues BEGIN
// IMMEDIATE, which takes SQLite's write lock at once, so a transaction never
// fails half-way with a lock upgrade. Another process writing the same file
// waits up to the busy timeout, then gets store.ErrConflict. The Store's
// read methods use a separate pool of read-only connections, which WAL lets
// run alongside the writer on the last committed state.
//
// The schema is versioned and embedded (migrations/*.sql); Open applies the
// missing migrations in one transaction and refuses a file whose schema is
// newer than the binary.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite" // also registers the "sqlite" database/sql driver

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
	"github.com/capledger/capledger/store/migration"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// ErrSchemaTooNew is returned by Open for a database written by a newer
// capledger: this binary does not know its schema and must not touch it.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

// DefaultBusyTimeout is how long a statement waits for another process's
// lock on the file before failing with store.ErrConflict.
const DefaultBusyTimeout = 5 * time.Second

// DefaultReadConns is the size of the read connection pool.
const DefaultReadConns = 4

// writerCacheKiB is the write connection's SQLite page cache (SQLite's
// default is 2,000 KiB). With a million accounts the interior pages of
// the accounts, currents and reservations B-trees alone outgrow the
// default, so a row cache miss read them again from the OS (a pread per
// page); 16 MiB holds them, and the leaves a batch touches, for a fixed
// 16 MiB of RSS (measured: -40 % of the read time of a batch of 100
// reserves over 100,000 accounts, engine BenchmarkBatchSubjects).
const writerCacheKiB = 16 << 10

type config struct {
	busyTimeout time.Duration
	readConns   int
	cacheRows   int
	// convertAutoVacuum: see WithAutoVacuumConversion.
	convertAutoVacuum bool
	// pipelined: see WithPipelinedSync (pipeline.go).
	pipelined bool
	// subjectFlushAge and subjectFlushCount: see WithSubjectIndexFlush
	// (subjectindex.go).
	subjectFlushAge   time.Duration
	subjectFlushCount int
	// auditCopyPages: see defaultAuditCopyPages (auditcopy.go); only
	// tests open a store with another.
	auditCopyPages int
}

// Option configures Open.
type Option func(*config)

// WithBusyTimeout sets how long a statement waits for another process's
// lock (default DefaultBusyTimeout).
func WithBusyTimeout(d time.Duration) Option { return func(c *config) { c.busyTimeout = d } }

// WithReadConns sets the size of the read pool (default DefaultReadConns).
func WithReadConns(n int) Option { return func(c *config) { c.readConns = n } }

// Store is a SQLite store.Store.
type Store struct {
	path   string
	w      *writer // the one write connection, driver level (writer.go)
	readDB *sql.DB // read-only connections for the Store's read methods
	r      readStmts
	closed atomic.Bool
	// writer is held by the one open Tx, from Begin until its Commit or
	// Rollback has finished with the row cache, and by Close.
	writer chan struct{}
	cache  *rowCache
	// commits counts the write transactions committed, for the
	// checkpointer.
	commits      atomic.Uint64
	checkpointer *checkpointer
	// pipelined and sync: pipelined durability (pipeline.go).
	pipelined bool
	sync      walSync
	// checkpointWriting is held by the one checkpoint writer
	// (compaction.go).
	checkpointWriting atomic.Bool
	// subjects is the console's subject index entries not yet in
	// reservation_subjects, and its flusher (subjectindex.go).
	subjects        *subjectPending
	stopSubjectsOne sync.Once
	// commitFault, when set (tests), makes a COMMIT that worked answer
	// its error: a COMMIT whose outcome the caller cannot know.
	commitFault atomic.Pointer[func() error]
	// auditCopyPages is the pages of a step of a full audit's copy
	// (auditcopy.go).
	auditCopyPages int
	// readOnly: opened by OpenReadOnly (readonly.go), no writer.
	readOnly bool
}

// CheckPath refuses a path Open refuses for its form alone: empty, or not
// a plain file path (the driver reads everything after '?' as parameters;
// an in-memory database would not be durable).
func CheckPath(path string) error {
	if path == "" {
		return errors.New("open sqlite: empty path")
	}
	if strings.ContainsAny(path, "?#") || strings.HasPrefix(path, "file:") || path == ":memory:" {
		return fmt.Errorf("open sqlite %q: the path must be a plain file path without '?' or '#'", path)
	}
	return nil
}

// Open opens (creating if needed, mode 0600: createPrivate) the database
// file at path, applies the missing schema migrations and returns the
// store. It returns an error wrapping ErrSchemaTooNew for a file written
// by a newer binary, and an error for a path the DSN cannot carry, a file
// that is not a SQLite database, or a filesystem where WAL or
// synchronous=FULL cannot be set; on a full disk, one naming the
// directory and its free space that wraps store.ErrUnavailable and
// syscall.ENOSPC (openFailed).
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	cfg := config{busyTimeout: DefaultBusyTimeout, readConns: DefaultReadConns, cacheRows: DefaultCacheRows,
		subjectFlushAge: DefaultSubjectFlushAge, subjectFlushCount: DefaultSubjectFlushCount, auditCopyPages: defaultAuditCopyPages}
	for _, o := range opts {
		o(&cfg)
	}
	if err := CheckPath(path); err != nil {
		return nil, err
	}
	if err := checkNoRestore(path); err != nil {
		return nil, err
	}
	if cfg.cacheRows < 1 {
		return nil, fmt.Errorf("open sqlite %s: a row cache of %d rows; want at least 1", path, cfg.cacheRows)
	}
	if cfg.subjectFlushAge <= 0 || cfg.subjectFlushCount < 1 {
		return nil, fmt.Errorf("open sqlite %s: subject index flush after %s or %d entries; want both positive", path, cfg.subjectFlushAge, cfg.subjectFlushCount)
	}
	if cfg.readConns < 1 {
		return nil, fmt.Errorf("open sqlite %s: %d read connections", path, cfg.readConns)
	}
	// Every connection's pragmas. journal_mode(WAL) is left out of setup's
	// connection: setup sets it itself, after what must precede it.
	pragmas := []string{
		fmt.Sprintf("busy_timeout(%d)", cfg.busyTimeout.Milliseconds()),
		"synchronous(FULL)",
		"foreign_keys(ON)",
		"wal_autocheckpoint(0)", // only the checkpointer checkpoints (checkpoint.go); commitNotWritten relies on it
		fmt.Sprintf("journal_size_limit(%d)", walSizeLimit),
	}
	s := &Store{path: path, writer: make(chan struct{}, 1), cache: newRowCache(cfg.cacheRows),
		pipelined: cfg.pipelined, auditCopyPages: max(cfg.auditCopyPages, 1)}
	s.sync.walPath = path + "-wal"
	s.sync.datasync = datasync
	// The write connection (and the checkpointer's, which shares its
	// connector) gets a page cache of writerCacheKiB; the read pool keeps
	// SQLite's default per connection. Pipelined, the writer commits with
	// synchronous=NORMAL and Sync fsyncs (pipeline.go).
	writerSync := syncFull
	if cfg.pipelined {
		writerSync = syncNormal
	}
	var writerPragmas []string
	for _, p := range pragmas {
		if !strings.HasPrefix(p, "synchronous(") {
			writerPragmas = append(writerPragmas, p)
		}
	}
	writerPragmas = append(writerPragmas, "journal_mode(WAL)", fmt.Sprintf("cache_size(-%d)", writerCacheKiB),
		fmt.Sprintf("synchronous(%d)", writerSync))
	writerDSN, err := dsn(path, writerPragmas...)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	connector, err := sqlite.NewConnector(writerDSN)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	// Setup (checks and migrations) runs through database/sql on a
	// connection of its own, closed before the writer opens: one write
	// connection at a time. It commits with synchronous=FULL in every mode,
	// and only it sets auto_vacuum, on a new file only (setup): on an
	// existing file the pragma would write the file's header in a
	// transaction of its own, and any other connection's commit makes the
	// writer's next transaction discard its page cache and the row cache
	// (PRAGMA data_version changes).
	setupDSN, err := dsn(path, pragmas...)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	setupConnector, err := sqlite.NewConnector(setupDSN)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	createPrivate(path)
	setupDB := sql.OpenDB(setupConnector)
	setupDB.SetMaxOpenConns(1)
	err = setup(ctx, setupDB)
	if err == nil {
		err = rebuildSubjectIndex(ctx, setupDB)
	}
	if err == nil && cfg.convertAutoVacuum {
		err = convertAutoVacuum(ctx, setupDB)
	}
	if closeErr := setupDB.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return nil, openFailed(path, err)
	}
	if s.w, err = openWriter(ctx, connector, writerSync); err != nil {
		return nil, openFailed(path, translate(ctx, err))
	}
	s.checkpointer = startCheckpointer(sql.OpenDB(connector), &s.commits, s.noteFsyncFailure)
	s.subjects = newSubjectPending(cfg.subjectFlushAge, cfg.subjectFlushCount)
	go s.runSubjectFlusher()
	readDSN, err := dsn(path, append(pragmas, "journal_mode(WAL)", "query_only(1)")...)
	if err == nil {
		s.readDB, err = sql.Open("sqlite", readDSN)
	}
	if err == nil {
		s.readDB.SetMaxOpenConns(cfg.readConns)
		s.readDB.SetMaxIdleConns(cfg.readConns)
		err = s.r.prepare(ctx, s.readDB)
	}
	if err != nil {
		s.Close()
		return nil, openFailed(path, translate(ctx, err))
	}
	return s, nil
}

// createPrivate creates the database file at path, empty and mode 0600
// (owner only: it holds tenants' names and usage), when nothing is there:
// SQLite would create it 0644 less the umask, readable by everyone under
// the usual 022, and it gives the -wal, -shm and -journal files it makes
// beside a database the database file's mode. SQLite takes a file of zero
// bytes for an empty database (setup sees page_count 0, a new file). An
// existing file, or anything else at path, is left as it is: an operator
// who set its mode chose it. Any other error is left to SQLite's own open
// of the file, which meets it too and reports it as Open always has
// (openFailed names a full disk).
func createPrivate(path string) {
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
		f.Close()
	}
}

// fileFormatPragmas take effect only before the file's first page is
// written, which journal_mode(WAL) or the first table does; afterwards
// they change nothing, silently (auto_vacuum from NONE only by a VACUUM
// outside WAL: convertAutoVacuum). The driver does not run a DSN's
// _pragma parameters in the order given but sorted by their text
// (busy_timeout first), so one of these in a DSN runs after
// journal_mode(WAL) (page_size) or before it only because its name sorts
// first (auto_vacuum). dsn refuses them; setup sets them, in order, on a
// new file.
var fileFormatPragmas = []string{"auto_vacuum", "encoding", "page_size"}

// dsn returns the driver DSN for path with each of pragmas as a _pragma
// parameter (written "name(value)"), or an error naming the first one in
// fileFormatPragmas: in a DSN it could not be relied on to take effect.
func dsn(path string, pragmas ...string) (string, error) {
	q := url.Values{}
	for _, p := range pragmas {
		name := strings.ToLower(strings.TrimSpace(p))
		if i := strings.IndexAny(name, "(= "); i >= 0 {
			name = name[:i]
		}
		if slices.Contains(fileFormatPragmas, name) {
			return "", fmt.Errorf("pragma %q cannot go in a DSN: it takes effect only before the file's first page is written, "+
				"and the driver runs DSN pragmas in name order, journal_mode(WAL) perhaps first; setup sets it on a new file", p)
		}
		q.Add("_pragma", p)
	}
	return path + "?" + q.Encode(), nil
}

// setup gives a new file its format (auto_vacuum INCREMENTAL, vacuum.go)
// before WAL mode writes its first page, puts the file in WAL mode, checks
// the pragmas took effect on a write connection and migrates. It returns
// an error when one did not: a file that is not in WAL mode or not
// synchronous=FULL, or a new file that did not become INCREMENTAL.
func setup(ctx context.Context, db *sql.DB) error {
	// One connection for the pragmas: auto_vacuum applies to the file only
	// if the connection that set it is the one that writes the first page.
	conn, err := db.Conn(ctx)
	if err != nil {
		return translate(ctx, err)
	}
	err = setFormat(ctx, conn)
	if closeErr := conn.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return err
	}
	return migrate(ctx, db)
}

// setFormat is setup's part on one connection.
func setFormat(ctx context.Context, conn *sql.Conn) error {
	var pages int64
	if err := conn.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		return translate(ctx, err)
	}
	created := pages == 0
	if created {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA auto_vacuum = %d", AutoVacuumIncremental)); err != nil {
			return fmt.Errorf("auto_vacuum: %w", translate(ctx, err))
		}
	}
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil {
		return translate(ctx, err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal_mode is %q, not WAL (does the filesystem support shared memory?)", mode)
	}
	if created {
		var vacuum int
		if err := conn.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&vacuum); err != nil {
			return translate(ctx, err)
		}
		if vacuum != AutoVacuumIncremental {
			return fmt.Errorf("a new file's auto_vacuum is %d, not INCREMENTAL (%d)", vacuum, AutoVacuumIncremental)
		}
	}
	var sync int64
	if err := conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		return translate(ctx, err)
	}
	if sync != syncFull {
		return fmt.Errorf("synchronous is %d, not FULL (%d)", sync, syncFull)
	}
	return nil
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration.Migration, error) { return migration.Read(migrationFiles, "migrations") }

// SchemaVersion is the newest schema version this binary knows.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil {
		panic(fmt.Sprintf("embedded migrations are malformed: %v", err)) // a build defect, caught by every test
	}
	return len(ms)
}

// migrate applies every embedded migration newer than the database's
// schema, in one transaction: either the file moves to the binary's
// version or it stays as it was. It returns an error wrapping
// ErrSchemaTooNew when the file is ahead of the binary.
func migrate(ctx context.Context, db *sql.DB) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", translate(ctx, err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY,
		name    TEXT NOT NULL
	)`); err != nil {
		return fmt.Errorf("migrate: %w", translate(ctx, err))
	}
	var current int
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&current); err != nil {
		return fmt.Errorf("migrate: %w", translate(ctx, err))
	}
	if current > len(ms) {
		return fmt.Errorf("%w: the file is at schema version %d, this binary knows up to %d; run a newer capledger (or restore a backup taken before the upgrade)",
			ErrSchemaTooNew, current, len(ms))
	}
	for _, m := range ms[current:] {
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("migrate %s: %w", m.File, translate(ctx, err))
		}
		if step := migrationSteps[m.Version]; step != nil {
			if err := step(ctx, tx); err != nil {
				return fmt.Errorf("migrate %s: %w", m.File, translate(ctx, err))
			}
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO schema_migrations (version, name) VALUES (?, ?)", m.Version, m.File); err != nil {
			return fmt.Errorf("migrate %s: %w", m.File, translate(ctx, err))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: %w", translate(ctx, err))
	}
	return nil
}

// migrationSteps are the Go parts of the migrations that need one, run
// after the version's SQL in the same transaction.
var migrationSteps = map[int]func(context.Context, *sql.Tx) error{
	13: fillAccountDebtors,
	23: addHeldElsewhere,
	24: countHeldElsewhere,
}

// countHeldElsewhere sets held_elsewhere (schema version 24) of every
// subject's current account to what the subject's other accounts hold
// reserved in the units it limits (ledger.HeldElsewhereOf: the count the
// ledger carries from switch to switch, which a store upgraded to version
// 23 began at 0 for the holds outstanding then), and clears it on every
// other account. It reads every policy and every account once, one
// subject's accounts at a time, and writes the current accounts of the
// subjects with holds elsewhere.
func countHeldElsewhere(ctx context.Context, tx *sql.Tx) error {
	policies := map[uint64]*ledger.Policy{}
	rows, err := tx.QueryContext(ctx, "SELECT "+policyCols+" FROM policies")
	if err != nil {
		return err
	}
	for rows.Next() {
		p, err := scanPolicy(rows)
		if err != nil {
			rows.Close()
			return err
		}
		policies[p.Generation] = &p
	}
	if err := rows.Close(); err != nil {
		return err
	}
	currents := map[ledger.PolicyKey]uint64{}
	rows, err = tx.QueryContext(ctx, "SELECT "+currentCols+" FROM account_currents")
	if err != nil {
		return err
	}
	for rows.Next() {
		var k ledger.PolicyKey
		var generation int64
		if err := rows.Scan(&k.Subject, &k.Route, &k.Region, &generation); err != nil {
			rows.Close()
			return err
		}
		currents[k] = uint64(generation)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	type count struct {
		key  ledger.AccountKey
		held ledger.Amounts
	}
	var counts []count
	var group []ledger.Account
	flush := func() {
		if len(group) < 2 {
			return
		}
		g, ok := currents[group[0].Key.SubjectKey()]
		var cur *ledger.Account
		var others []ledger.Holding
		for i := range group {
			a := &group[i]
			if ok && a.Key.Generation == g {
				cur = a
			} else if p := policies[a.Key.Generation]; p != nil {
				others = append(others, ledger.Holding{Account: a, Policy: p})
			}
		}
		if cp := policies[g]; cur != nil && cp != nil {
			if held := ledger.HeldElsewhereOf(cur, cp, others); held != (ledger.Amounts{}) {
				counts = append(counts, count{cur.Key, held})
			}
		}
	}
	rows, err = tx.QueryContext(ctx, "SELECT "+accountCols+" FROM accounts ORDER BY subject, route, region, generation")
	if err != nil {
		return err
	}
	for rows.Next() {
		a, err := scanAccount(rows)
		if err != nil {
			rows.Close()
			return err
		}
		if len(group) > 0 && group[0].Key.SubjectKey() != a.Key.SubjectKey() {
			flush()
			group = group[:0]
		}
		group = append(group, a)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	flush()
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET held_elsewhere = NULL WHERE held_elsewhere IS NOT NULL"); err != nil {
		return err
	}
	for _, c := range counts {
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET held_elsewhere = ? WHERE subject = ? AND route = ? AND region = ? AND generation = ?",
			heldElsewhereArg(&c.held), c.key.Subject, c.key.Route, c.key.Region, int64(c.key.Generation)); err != nil {
			return err
		}
	}
	return nil
}

// addHeldElsewhere adds accounts.held_elsewhere (schema version 23) unless
// the table has it: SQLite has no ADD COLUMN IF NOT EXISTS, and a version
// runs again when its row in schema_migrations is gone (as the upgrade
// tests make an earlier file).
func addHeldElsewhere(ctx context.Context, tx *sql.Tx) error {
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM pragma_table_info('accounts') WHERE name = 'held_elsewhere'").Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, "ALTER TABLE accounts ADD COLUMN held_elsewhere BLOB")
	return err
}

// fillAccountDebtors adds the key of every stored account that owes to
// account_debtors (schema version 13): the balances are encoded, so SQL
// cannot pick them. It reads every account once, keeping only the keys of
// the debtors.
func fillAccountDebtors(ctx context.Context, tx *sql.Tx) error {
	// held_elsewhere comes with version 23: read as NULL here.
	rows, err := tx.QueryContext(ctx, "SELECT "+accountColsV22+", NULL FROM accounts ORDER BY subject, route, region, generation")
	if err != nil {
		return err
	}
	defer rows.Close()
	var debtors []ledger.AccountKey
	for rows.Next() {
		a, err := scanAccount(rows)
		if err != nil {
			return err
		}
		if store.RowInDebt(&a) {
			debtors = append(debtors, a.Key)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, k := range debtors {
		if _, err := tx.ExecContext(ctx, writeSQL[wDebtorPut], k.Subject, k.Route, k.Region, int64(k.Generation)); err != nil {
			return err
		}
	}
	return nil
}

// closeFlushWait bounds how long Close waits for the writer to flush the
// pending subject index entries (a transaction may hold it, even the
// caller's own).
const closeFlushWait = time.Second

var errClosed = fmt.Errorf("%w: sqlite store closed", store.ErrUnavailable)

// Close closes the write connection and the read pool and returns the
// first error. An open transaction is rolled back: its connection closes
// when it ends, and its Commit fails with store.ErrUnavailable. Later calls
// return store.ErrUnavailable.
func (s *Store) Close() error {
	if s.subjects != nil && !s.closed.Load() {
		s.stopSubjectsOne.Do(func() {
			close(s.subjects.stop)
			<-s.subjects.done
			// What is still pending goes to the table now, unless a
			// transaction holds the writer past the wait: the next Open
			// rebuilds it from the journal then.
			ctx, cancel := context.WithTimeout(context.Background(), closeFlushWait)
			defer cancel()
			_ = s.flushSubjects(ctx)
		})
	}
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	if s.checkpointer != nil {
		errs = append(errs, s.checkpointer.close())
	}
	s.sync.close()
	if s.readDB != nil {
		s.r.close()
		errs = append(errs, s.readDB.Close())
	}
	if s.w != nil {
		select {
		case s.writer <- struct{}{}:
			errs = append(errs, s.w.close())
			<-s.writer
		default:
			// A Tx holds the writer and may be running a statement:
			// closing the connection under it would free memory the
			// statement still uses. The Tx closes it when it ends.
		}
	}
	return errors.Join(errs...)
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

func durationOf(ns int64) time.Duration { return time.Duration(ns) }

// Begin waits for the write connection (or for ctx to end, returning its
// error) and opens a BEGIN IMMEDIATE transaction, which waits up to the
// busy timeout for another process's write lock. It returns
// store.ErrConflict if another process holds the file's write lock past the
// busy timeout, store.ErrUnavailable after Close or on I/O errors. The Tx
// holds the writer until its Commit or Rollback.
func (s *Store) Begin(ctx context.Context) (store.Tx, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	if s.readOnly {
		return nil, fmt.Errorf("begin: %w", errReadOnly)
	}
	if err := s.sync.failure(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	select {
	case s.writer <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("begin: %w", ctx.Err())
	}
	if s.closed.Load() {
		<-s.writer
		return nil, errClosed
	}
	// Statements run without ctx's cancellation (see stmtCtx); BEGIN
	// IMMEDIATE waits up to the busy timeout for another process's lock.
	t := &Tx{s: s, w: s.w, ctx: ctx}
	if err := s.w.exec(stmtCtx(ctx), s.w.begin, nil); err != nil {
		<-s.writer
		return nil, fmt.Errorf("begin: %w", translate(ctx, err))
	}
	if err := t.syncCache(ctx); err != nil {
		t.rollback(ctx)
		<-s.writer
		return nil, fmt.Errorf("begin: %w", err)
	}
	return t, nil
}

// queryOne runs a prepared single-row read on the read pool.
func queryOne[T any](ctx context.Context, s *Store, stmt *sql.Stmt, scan func(scanner) (T, error), what string, args ...any) (T, error) {
	var zero T
	if s.closed.Load() {
		return zero, errClosed
	}
	v, err := scan(stmt.QueryRowContext(ctx, args...))
	if err != nil {
		err = fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	s.readBarrier(ctx, &err)
	if err != nil {
		return zero, err
	}
	return v, nil
}

// queryAll runs a prepared multi-row read and scans every row.
func queryAll[T any](ctx context.Context, q interface {
	QueryContext(context.Context, ...any) (*sql.Rows, error)
}, scan func(scanner) (T, error), what string, args ...any) ([]T, error) {
	return queryAllSized(ctx, q, 0, scan, what, args...)
}

// queryAllSized is queryAll into a slice of capacity size: for the large
// reads of a snapshot (a million accounts), growing the slice by
// appending allocated about five times the rows' size, which the heap
// then grew to.
func queryAllSized[T any](ctx context.Context, q interface {
	QueryContext(context.Context, ...any) (*sql.Rows, error)
}, size int64, scan func(scanner) (T, error), what string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	defer rows.Close()
	var out []T
	if size > 0 {
		out = make([]T, 0, size)
	}
	read := 0
	for rows.Next() {
		read++
		store.RowRead(ctx, read) // a bounded audit waits anew while rows arrive
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, translate(ctx, err))
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	return out, nil
}

// ReservationGet returns the committed reservation, or store.ErrNotFound.
func (s *Store) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	return queryOne(ctx, s, s.r.reservation, scanReservation, "reservation "+id, id)
}

// AccountGet returns the committed account, or store.ErrNotFound.
func (s *Store) AccountGet(ctx context.Context, key ledger.AccountKey) (ledger.Account, error) {
	if key.Generation > 1<<63-1 {
		return ledger.Account{}, fmt.Errorf("account %s: %w", key, store.ErrNotFound)
	}
	return queryOne(ctx, s, s.r.account, scanAccount, "account "+key.String(),
		key.Subject, key.Route, key.Region, int64(key.Generation))
}

// AccountList returns the accounts of subject ordered by generation, or
// every account ordered by key when subject.Subject is empty; no match is
// an empty list.
func (s *Store) AccountList(ctx context.Context, subject ledger.PolicyKey) (_ []ledger.Account, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if subject.Subject == "" {
		return queryAll(ctx, s.r.accountsAll, scanAccount, "account list")
	}
	return queryAll(ctx, s.r.accountsOf, scanAccount, "account list "+subject.String(),
		subject.Subject, subject.Route, subject.Region)
}

// AccountsOfSubjects returns the accounts of subjects (every generation
// of each) in key order; a key with an empty Subject names none, and none
// found is an empty list. The distinct keys are read in statements of up
// to 128 (subjectChunkSizes), each on its own, as separate AccountList
// calls would read them; the rows are then ordered here (Go compares
// strings as bytes, as SQLite's BINARY collation does).
func (s *Store) AccountsOfSubjects(ctx context.Context, subjects []ledger.PolicyKey) (out []ledger.Account, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	keys := slices.DeleteFunc(slices.Clone(subjects), func(k ledger.PolicyKey) bool { return k.Subject == "" })
	out, err = queryByKeys(ctx, pooled(&s.r.accountsOfSubjects), scanAccount, "accounts of subjects", keys)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b ledger.Account) int { return a.Key.Compare(b.Key) })
	return out, nil
}

// pooled returns stmts (one per size of subjectChunkSizes) by size, each
// run on its own on the read pool.
func pooled(stmts *[len(subjectChunkSizes)]*sql.Stmt) func(size int) queryer {
	return func(size int) queryer { return stmts[size] }
}

// inReadTx returns stmts (one per size of subjectChunkSizes) by size, run
// in tx.
func inReadTx(ctx context.Context, tx *sql.Tx, stmts *[len(subjectChunkSizes)]*sql.Stmt) func(size int) queryer {
	return func(size int) queryer { return tx.StmtContext(ctx, stmts[size]) }
}

// queryByKeys reads the rows of the distinct keys of keys, up to 128 keys
// a statement: each chunk with the smallest statement of stmt (by index
// of subjectChunkSizes) that holds it, its unused places NULL (no key
// equals it).
func queryByKeys[T any](ctx context.Context, stmt func(size int) queryer, scan func(scanner) (T, error), what string, keys []ledger.PolicyKey) ([]T, error) {
	distinct := slices.Clone(keys)
	slices.SortFunc(distinct, ledger.PolicyKey.Compare)
	distinct = slices.Compact(distinct)
	var out []T
	largest := subjectChunkSizes[len(subjectChunkSizes)-1]
	for chunk := range slices.Chunk(distinct, largest) {
		size := 0
		for size < len(subjectChunkSizes)-1 && subjectChunkSizes[size] < len(chunk) {
			size++
		}
		args := make([]any, 0, 3*subjectChunkSizes[size])
		for _, k := range chunk {
			args = append(args, k.Subject, k.Route, k.Region)
		}
		for len(args) < cap(args) {
			args = append(args, nil)
		}
		found, err := queryAll(ctx, stmt(size), scan, what, args...)
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
	}
	return out, nil
}

// PolicyGet returns the policy generation, or store.ErrNotFound.
func (s *Store) PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error) {
	if generation > 1<<63-1 {
		return ledger.Policy{}, fmt.Errorf("policy generation %d: %w", generation, store.ErrNotFound)
	}
	return queryOne(ctx, s, s.r.policy, scanPolicy, fmt.Sprintf("policy generation %d", generation), int64(generation))
}

// PoliciesOfGenerations returns the committed policies of generations,
// by generation; one that does not exist (above math.MaxInt64 none does)
// is absent. The distinct generations are read in statements of up to
// 128 (subjectChunkSizes, as PolicyHeads reads keys), each on its own.
func (s *Store) PoliciesOfGenerations(ctx context.Context, generations []uint64) (_ map[uint64]ledger.Policy, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	return policiesByGenerations(ctx, pooled(&s.r.policiesOf), generations)
}

// policiesByGenerations reads the policies of the distinct generations of
// generations by generation, up to 128 a statement of stmt (policiesOfSQL
// of each size of subjectChunkSizes); one that does not exist is absent.
func policiesByGenerations(ctx context.Context, stmt func(size int) queryer, generations []uint64) (map[uint64]ledger.Policy, error) {
	distinct := slices.DeleteFunc(slices.Clone(generations), func(g uint64) bool { return g > math.MaxInt64 })
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	out := make(map[uint64]ledger.Policy, len(distinct))
	largest := subjectChunkSizes[len(subjectChunkSizes)-1]
	for chunk := range slices.Chunk(distinct, largest) {
		size := 0
		for size < len(subjectChunkSizes)-1 && subjectChunkSizes[size] < len(chunk) {
			size++
		}
		args := make([]any, 0, subjectChunkSizes[size])
		for _, g := range chunk {
			args = append(args, int64(g))
		}
		for len(args) < cap(args) {
			args = append(args, nil)
		}
		found, err := queryAll(ctx, stmt(size), scanPolicy, "policies of generations", args...)
		if err != nil {
			return nil, err
		}
		for _, p := range found {
			out[p.Generation] = p
		}
	}
	return out, nil
}

// PolicyHead returns a policy key's committed head, or store.ErrNotFound.
func (s *Store) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	return queryOne(ctx, s, s.r.head, scanHead, "policy head "+key.String(), key.Subject, key.Route, key.Region)
}

// PolicyHeads returns the committed heads of keys, by key; a key without
// a head is absent. The distinct keys are read in statements of up to 128
// (subjectChunkSizes, as AccountsOfSubjects reads), each on its own.
func (s *Store) PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (_ map[ledger.PolicyKey]ledger.PolicyHead, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	return headsByKeys(ctx, pooled(&s.r.headsOf), keys)
}

// headsByKeys reads the heads of the distinct keys of keys by key, up to
// 128 a statement of stmt (headsOfSQL of each size of subjectChunkSizes);
// a key without a head is absent.
func headsByKeys(ctx context.Context, stmt func(size int) queryer, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	found, err := queryByKeys(ctx, stmt, scanHead, "policy heads", keys)
	if err != nil {
		return nil, err
	}
	out := make(map[ledger.PolicyKey]ledger.PolicyHead, len(found))
	for _, h := range found {
		out[h.Key] = h
	}
	return out, nil
}

// PolicyList returns every policy generation, oldest first.
func (s *Store) PolicyList(ctx context.Context) (_ []ledger.Policy, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	return queryAll(ctx, s.r.policies, scanPolicy, "policy list")
}

// PolicyListAfter returns the generations newer than after, oldest first.
func (s *Store) PolicyListAfter(ctx context.Context, after uint64) (_ []ledger.Policy, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if after > math.MaxInt64 {
		return nil, nil
	}
	return queryAll(ctx, s.r.policiesAfter, scanPolicy, "policy list", int64(after))
}

// PolicyChanges returns the committed ledger.MetaPolicyChanges row, 0
// when it was never set.
func (s *Store) PolicyChanges(ctx context.Context) (uint64, error) {
	v, err := queryOne(ctx, s, s.r.meta, scanInt, "meta "+ledger.MetaPolicyChanges, ledger.MetaPolicyChanges)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return uint64(v), nil
}

// policyPageSQL reads a page of PolicyPage: a range of the primary key
// (generation), each filter left out when empty, and each row's key's
// active generation from its head (a primary-key lookup).
const policyPageSQL = "SELECT " + policyCols + `, (SELECT h.active FROM policy_heads h
	WHERE h.subject = policies.subject AND h.route = policies.route AND h.region = policies.region)
	FROM policies WHERE generation > ?1
	AND (?2 = '' OR subject = ?2) AND (?3 = '' OR route = ?3) AND (?4 = '' OR region = ?4)
	ORDER BY generation LIMIT ?5`

// policyPageOfSubjectSQL is policyPageSQL with a subject: the subject's
// range of policies_key (schema 20), its rows then sorted by generation
// (a subject has a policy per route and region it is limited on, and
// their generations, not a policy per tenant). SQLite plans a statement
// once, whatever it is bound to, so policyPageSQL's subject filter (an
// OR with the empty subject) could never seek the index: policyPageSQL scans the policies in generation
// order, which is the right plan without a subject.
const policyPageOfSubjectSQL = "SELECT " + policyCols + `, (SELECT h.active FROM policy_heads h
	WHERE h.subject = policies.subject AND h.route = policies.route AND h.region = policies.region)
	FROM policies WHERE subject = ?2 AND generation > ?1
	AND (?3 = '' OR route = ?3) AND (?4 = '' OR region = ?4)
	ORDER BY generation LIMIT ?5`

// scanListedPolicy reads a row of policyPageSQL.
func scanListedPolicy(sc scanner) (store.ListedPolicy, error) {
	var active sql.NullInt64
	p, err := scanPolicy(withColumn{sc, &active})
	return store.ListedPolicy{Policy: p, Active: active.Valid && active.Int64 == int64(p.Generation)}, err
}

// withColumn is a scanner whose rows have one more column after the
// ones its caller scans, into extra.
type withColumn struct {
	sc    scanner
	extra any
}

func (w withColumn) Scan(dest ...any) error { return w.sc.Scan(append(dest, w.extra)...) }

// PolicyPage returns up to f.Limit generations newer than f.After that
// f's filters select, oldest first, each with whether its key's head
// names it active (store.Store.PolicyPage).
func (s *Store) PolicyPage(ctx context.Context, f store.PolicyFilter) (_ []store.ListedPolicy, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if f.Limit <= 0 {
		return nil, fmt.Errorf("policy page: limit %d is not positive", f.Limit)
	}
	if f.After > math.MaxInt64 {
		return nil, nil
	}
	page := s.r.policyPage
	if f.Subject != "" {
		page = s.r.policyPageOfSubject
	}
	return queryAll(ctx, page, scanListedPolicy, "policy page", int64(f.After), f.Subject, f.Route, f.Region, f.Limit)
}

// ShardGet returns the shard, or store.ErrNotFound.
func (s *Store) ShardGet(ctx context.Context, id string) (ledger.Shard, error) {
	return queryOne(ctx, s, s.r.shard, scanShard, "shard "+id, id)
}

// ShardList returns every shard, ordered by id.
func (s *Store) ShardList(ctx context.Context) (_ []ledger.Shard, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	return queryAll(ctx, s.r.shards, scanShard, "shard list")
}

func scanID(sc scanner) (string, error) {
	var id string
	err := sc.Scan(&id)
	return id, err
}

// scanDue reads a row of dueSQL.
func scanDue(sc scanner) (store.DueReservation, error) {
	var (
		d     store.DueReservation
		state int64
		at    int64
		c     codec.Conv
	)
	if err := sc.Scan(&d.ID, &state, &at); err != nil {
		return d, err
	}
	d.State, d.DueAt = ledger.State(state), c.Time(at)
	return d, c.Err()
}

// ReservationsDue returns up to limit reservations due at now (RESERVED
// with ExpiresAt <= now, every EXPIRING, STARTED with a non-zero
// ExecutionDeadline <= now), each with its state and due time, ordered by
// the time they became due, ties by id; none for limit <= 0. It reads the
// partial index reservations_due, and the table for each row's state.
func (s *Store) ReservationsDue(ctx context.Context, now time.Time, limit int) (_ []store.DueReservation, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if limit <= 0 {
		return nil, nil
	}
	return queryAllSized(ctx, s.r.due, int64(min(limit, 1024)), scanDue, "reservations due", now.UnixNano(), limit)
}

// ReservationsUnknown returns up to f.Limit USAGE_UNKNOWN reservations
// in (UnknownAt, ID) order, strictly after f.After unless it is the zero
// cursor, with f's subject and route when they are not empty; none is an
// empty list. It returns an error for f.Limit <= 0 and for a cursor time
// no row can hold (one codec.Conv.Nanos refuses). It reads the partial
// index reservations_usage_unknown_at.
func (s *Store) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) (_ []ledger.Reservation, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if f.Limit <= 0 {
		return nil, fmt.Errorf("reservations unknown: limit %d is not positive", f.Limit)
	}
	if f.After == (store.UnknownCursor{}) {
		return queryAll(ctx, s.r.unknownFirst, scanReservation, "reservations unknown", f.Subject, f.Route, f.Limit)
	}
	var c codec.Conv
	after := c.Nanos(f.After.MarkedAt)
	if err := c.Err(); err != nil {
		return nil, fmt.Errorf("reservations unknown: cursor: %w", err)
	}
	return queryAll(ctx, s.r.unknownAfter, scanReservation, "reservations unknown", f.Subject, f.Route, f.Limit,
		after, f.After.ID)
}

// ReservationsUnknownBacklog returns how many reservations are
// USAGE_UNKNOWN and the earliest UnknownAt among them (the zero time when
// there are none), from one scan of the partial index
// reservations_usage_unknown_at.
func (s *Store) ReservationsUnknownBacklog(ctx context.Context) (store.UnknownBacklog, error) {
	scan := func(sc scanner) (store.UnknownBacklog, error) {
		var (
			b      store.UnknownBacklog
			c      codec.Conv
			oldest int64
		)
		if err := sc.Scan(&b.Count, &oldest); err != nil {
			return b, err
		}
		b.OldestMarkedAt = c.Time(oldest)
		return b, c.Err()
	}
	return queryOne(ctx, s, s.r.unknownBacklog, scan, "reservations unknown backlog")
}

// AccountsInDebtCount counts the keys of account_debtors (the accounts
// whose row owes), reading that table's key only.
func (s *Store) AccountsInDebtCount(ctx context.Context) (int64, error) {
	return queryOne(ctx, s, s.r.debtorCount, func(sc scanner) (n int64, err error) {
		err = sc.Scan(&n)
		return n, err
	}, "accounts in debt count")
}

// AccountsInDebt returns up to f.Limit accounts that owe debt in some
// balance (OverdraftIssued > OverdraftRepaid, any of the row's
// MaxDimensions), in primary-key order, strictly after f.After unless it
// is the zero key; none is an empty list. It returns an error for
// f.Limit <= 0 and for a cursor generation above math.MaxInt64.
//
// It reads the keys of account_debtors after the cursor, which the
// transaction writing an account keeps (accountwrite.go), and their
// accounts only: one query, whatever the number of accounts not in debt.
func (s *Store) AccountsInDebt(ctx context.Context, f store.DebtFilter) (_ []ledger.Account, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if f.Limit <= 0 {
		return nil, fmt.Errorf("accounts in debt: limit %d is not positive", f.Limit)
	}
	var c codec.Conv
	generation := c.Int(f.After.Generation)
	if err := c.Err(); err != nil {
		return nil, fmt.Errorf("accounts in debt: cursor %s: %w", f.After, err)
	}
	if f.After == (ledger.AccountKey{}) {
		return queryAll(ctx, s.r.debtFirst, scanAccount, "accounts in debt", f.Limit)
	}
	return queryAll(ctx, s.r.debtAfter, scanAccount, "accounts in debt", f.Limit,
		f.After.Subject, f.After.Route, f.After.Region, generation)
}

// AccountsPage returns up to f.Limit accounts that f selects, in key
// order after f.After (store.Store.AccountsPage), each page one
// statement: with a subject, a range of its accounts only; with a route
// and no subject, a range of accounts_by_route.
func (s *Store) AccountsPage(ctx context.Context, f store.AccountFilter) (_ []ledger.Account, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if f.Limit <= 0 {
		return nil, fmt.Errorf("accounts page: limit %d is not positive", f.Limit)
	}
	var c codec.Conv
	generation := c.Int(f.After.Generation)
	if err := c.Err(); err != nil {
		return nil, fmt.Errorf("accounts page: cursor %s: %w", f.After, err)
	}
	if err := f.Problem(); err != nil {
		return nil, fmt.Errorf("accounts page: %w", err)
	}
	if f.Subject != "" {
		// The subject's range, from after the cursor: SQLite compares
		// text as bytes, as Go does.
		route, region, after := "", "", int64(-1)
		switch {
		case f.After == (ledger.AccountKey{}) || f.After.Subject < f.Subject:
		case f.After.Subject > f.Subject:
			return nil, nil
		default:
			route, region, after = f.After.Route, f.After.Region, generation
		}
		return queryAll(ctx, s.r.pageOfSubject, scanAccount, "accounts page", f.Limit,
			f.Subject, route, region, after, f.Route, f.Region)
	}
	if f.OfRoute() {
		subject, region, after, past := f.RouteSeek()
		if past {
			return queryAll(ctx, s.r.pageOfRoutePast, scanAccount, "accounts page", f.Limit, f.Route, subject, f.Region)
		}
		return queryAll(ctx, s.r.pageOfRoute, scanAccount, "accounts page", f.Limit, f.Route, subject, region, after, f.Region)
	}
	if f.After == (ledger.AccountKey{}) {
		return queryAll(ctx, s.r.pageFirst, scanAccount, "accounts page", f.Limit)
	}
	return queryAll(ctx, s.r.pageAfter, scanAccount, "accounts page", f.Limit,
		f.After.Subject, f.After.Route, f.After.Region, generation)
}

// Snapshot reads every row in one read transaction (a consistent WAL
// snapshot): accounts by key, reservations by id, moves by receipt id,
// shards by id, policies by generation, statements and journal in
// insertion order (the journal table's rows, then every journal batch's
// entries), JournalComplete set.
func (s *Store) Snapshot(ctx context.Context) (_ *ledger.Snapshot, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	tx, err := s.readDB.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", translate(ctx, err))
	}
	defer tx.Rollback()
	return s.snapshotRows(ctx, tx, true)
}

// snapshotRows reads the rows of a snapshot in tx: always the
// accounts, moves, shards, statements, retained totals and checkpoint
// chain; the policies, the reservations and the journal after the last
// checkpoint only when full is set (AuditSnapshot reads the policies of
// the generations asked, snapshotPoliciesOf, and streams the others).
func (s *Store) snapshotRows(ctx context.Context, tx *sql.Tx, full bool) (*ledger.Snapshot, error) {
	var err error
	q := func(query string) queryer { return txQuery{tx, query} }
	snap := &ledger.Snapshot{JournalComplete: true}
	if full { // else read a page at a time (snapshotPoliciesOf)
		if snap.Policies, err = queryAll(ctx, q("SELECT "+policyCols+" FROM policies ORDER BY generation"), scanPolicy, "snapshot policies"); err != nil {
			return nil, err
		}
	}
	if full { // else streamed (streamAccounts)
		var accounts int64
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM accounts").Scan(&accounts); err != nil {
			return nil, fmt.Errorf("snapshot accounts: %w", translate(ctx, err))
		}
		if snap.Accounts, err = queryAllSized(ctx, q("SELECT "+accountCols+" FROM accounts ORDER BY subject, route, region, generation"), accounts, scanAccount, "snapshot accounts"); err != nil {
			return nil, err
		}
	}
	if full {
		if snap.Reservations, err = queryAll(ctx, q("SELECT "+reservationCols+" FROM reservations ORDER BY id"), scanReservation, "snapshot reservations"); err != nil {
			return nil, err
		}
	}
	if snap.Moves, err = queryAll(ctx, q("SELECT "+moveCols+" FROM moves ORDER BY receipt_id"), scanMove, "snapshot moves"); err != nil {
		return nil, err
	}
	if snap.Shards, err = queryAll(ctx, q("SELECT "+shardCols+" FROM shards ORDER BY id"), scanShard, "snapshot shards"); err != nil {
		return nil, err
	}
	if snap.Statements, err = queryAll(ctx, q("SELECT "+statementCols+" FROM statements ORDER BY seq"), scanStatement, "snapshot statements"); err != nil {
		return nil, err
	}
	if snap.Retained, err = queryAll(ctx, q(retainedSnapshotSQL), scanRetained, "snapshot retained"); err != nil {
		return nil, err
	}
	if snap.RetainedShards, err = retainedShards(ctx, q(metaPrefixSQL)); err != nil {
		return nil, err
	}
	// Version 15's migration wrote the row (store.MetaForgetsJournaledAfter).
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(value), 0) FROM meta WHERE name = ?", store.MetaForgetsJournaledAfter).
		Scan(&snap.ForgetsJournaledAfter); err != nil {
		return nil, fmt.Errorf("snapshot meta: %w", translate(ctx, err))
	}
	if snap.Checkpoints, err = checkpointChain(ctx, tx, full); err != nil {
		return nil, err
	}
	if !full {
		return snap, nil
	}
	err = journalSince(ctx, tx, snap.LastCheckpoint(), func(_ int64, batch []ledger.JournalEntry) error {
		snap.Journal = append(snap.Journal, batch...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// snapshotPoliciesOf returns the policies of generations in tx, by
// generation (ledger.Snapshot.PoliciesOf): a statement per 128 of them,
// as PoliciesOfGenerations reads.
func snapshotPoliciesOf(ctx context.Context, tx *sql.Tx, generations []uint64) (map[uint64]ledger.Policy, error) {
	distinct := slices.DeleteFunc(slices.Clone(generations), func(g uint64) bool { return g > math.MaxInt64 })
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	out := make(map[uint64]ledger.Policy, len(distinct))
	for chunk := range slices.Chunk(distinct, subjectChunkSizes[len(subjectChunkSizes)-1]) {
		args := make([]any, len(chunk))
		for i, g := range chunk {
			args[i] = int64(g)
		}
		found, err := queryAll(ctx, txQuery{tx, policiesOfSQL(len(chunk))}, scanPolicy, "snapshot policies", args...)
		if err != nil {
			return nil, err
		}
		for _, p := range found {
			out[p.Generation] = p
		}
	}
	return out, nil
}

type queryer interface {
	QueryContext(context.Context, ...any) (*sql.Rows, error)
}

// txQuery adapts a query string on a transaction to queryAll.
type txQuery struct {
	tx    *sql.Tx
	query string
}

func (q txQuery) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	return q.tx.QueryContext(ctx, q.query, args...)
}

// owingOfSubjectsSQL reads, for n subject keys bound in order (subject,
// route, region, owing-set name, the names under it from ?, below ?),
// each one's current pointer ('c') and owing-set Meta rows ('m'): a seek
// of account_currents' key and of meta's per key.
func owingOfSubjectsSQL(n int) string {
	values := strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?), ", n), ", ")
	return "WITH k(subject, route, region, name, lo, hi) AS (VALUES " + values + ")" +
		" SELECT k.subject, k.route, k.region, 'c', '', c.generation FROM k JOIN account_currents c" +
		" ON c.subject = k.subject AND c.route = k.route AND c.region = k.region" +
		" UNION ALL SELECT k.subject, k.route, k.region, 'm', m.name, m.value FROM k JOIN meta m ON m.name = k.name" +
		" UNION ALL SELECT k.subject, k.route, k.region, 'm', m.name, m.value FROM k JOIN meta m ON m.name >= k.lo AND m.name < k.hi"
}

// AccountsView returns the store.AccountsView of subjects
// (store.ReadAccountsView) from one read transaction on the read pool
// (one WAL snapshot): the accounts' statements, then the owing rows',
// the heads' and the policies' (up to 128 keys or generations a
// statement, each kind prepared once).
func (s *Store) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (view store.AccountsView, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return store.AccountsView{}, errClosed
	}
	tx, err := s.readDB.BeginTx(ctx, nil)
	if err != nil {
		return store.AccountsView{}, fmt.Errorf("accounts view: %w", translate(ctx, err))
	}
	defer tx.Rollback()
	return store.ReadAccountsView(ctx, subjects, store.ViewReads{
		Accounts: func(keys []ledger.PolicyKey) ([]ledger.Account, error) {
			return queryByKeys(ctx, inReadTx(ctx, tx, &s.r.accountsOfSubjects), scanAccount, "accounts view", keys)
		},
		Owing: func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]store.SubjectOwing, error) {
			return owingByKeys(ctx, inReadTx(ctx, tx, &s.r.owingOf), keys)
		},
		Heads: func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
			return headsByKeys(ctx, inReadTx(ctx, tx, &s.r.headsOf), keys)
		},
		Policies: func(generations []uint64) (map[uint64]ledger.Policy, error) {
			return policiesByGenerations(ctx, inReadTx(ctx, tx, &s.r.policiesOf), generations)
		},
	})
}

// owingByKeys reads the current pointers and owing-set Meta rows of keys
// (distinct, in order) by subject key, up to 128 keys a statement of stmt
// (owingOfSubjectsSQL of each size of subjectChunkSizes).
func owingByKeys(ctx context.Context, stmt func(size int) queryer, keys []ledger.PolicyKey) (map[ledger.PolicyKey]store.SubjectOwing, error) {
	out := map[ledger.PolicyKey]store.SubjectOwing{}
	type row struct {
		key   ledger.PolicyKey
		kind  string
		name  string
		value int64
	}
	scan := func(sc scanner) (r row, err error) {
		err = sc.Scan(&r.key.Subject, &r.key.Route, &r.key.Region, &r.kind, &r.name, &r.value)
		return r, err
	}
	largest := subjectChunkSizes[len(subjectChunkSizes)-1]
	for chunk := range slices.Chunk(keys, largest) {
		size := 0
		for size < len(subjectChunkSizes)-1 && subjectChunkSizes[size] < len(chunk) {
			size++
		}
		args := make([]any, 0, 6*subjectChunkSizes[size])
		for _, k := range chunk {
			base := ledger.OwingMetaName(k)
			args = append(args, k.Subject, k.Route, k.Region, base, base+"/", store.PrefixEnd(base+"/"))
		}
		for len(args) < cap(args) {
			args = append(args, nil) // no row's key or name equals NULL
		}
		found, err := queryAll(ctx, stmt(size), scan, "owing of subjects", args...)
		if err != nil {
			return nil, err
		}
		for _, r := range found {
			o := out[r.key]
			if r.kind == "c" {
				var c codec.Conv
				o.Current, o.HasCurrent = c.Uint(r.value), true
				if err := c.Err(); err != nil {
					return nil, fmt.Errorf("owing of subjects: current generation of %s: %w", r.key, err)
				}
			} else {
				if o.Meta == nil {
					o.Meta = map[string]int64{}
				}
				o.Meta[r.name] = r.value
			}
			out[r.key] = o
		}
	}
	return out, nil
}
