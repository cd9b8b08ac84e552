// Package postgres is the PostgreSQL store: several `capledger serve`
// replicas share one database and stay linearizable because every row a
// write transaction reads is locked in the database (SELECT ... FOR NO KEY
// UPDATE / FOR SHARE) until it commits, and every insert is guarded by a
// primary key or unique constraint.
//
// Locks on exclusively locked rows (meta counters, shards, reservations,
// subjects' owing sets, accounts) are taken in one fixed order (rank in
// tx.go; a subject's owing-set rows before any of its accounts): a transaction waits for a row
// that sorts after every row it already holds as long as lock_timeout
// allows, and for an earlier row only briefly (outOfOrderLockTimeout,
// 20ms), giving up with store.ErrConflict when the holder has not
// committed by then. A wait cycle (batches that touch the same accounts in
// different orders on different replicas) is thus broken within that
// bound, before PostgreSQL's deadlock detector runs, and the engine reruns
// the refused batch; an ordinary wait for another replica's batch on a hot
// account succeeds instead of failing the batch.
//
// The database also checks the ledger's arithmetic: every conservation
// term is a column with a CHECK that it is non-negative, and each account
// dimension's row must satisfy the conservation equation.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Store is a store.Store on PostgreSQL. It is safe for concurrent use; each
// write transaction holds one pooled connection until it ends.
type Store struct {
	pool *pgxpool.Pool
	c    counters
	// planPerStatement is set when write transactions keep cached plans
	// and plan only their lookups by arrays of keys at each run (plan.go).
	planPerStatement bool
	// checkpointTTL, when positive, replaces checkpointLeaseTTL (tests).
	checkpointTTL time.Duration
	// connConfig is the pool's connection configuration, for CheckPath's
	// connections; relied, the session settings the store relies on with
	// the values it sends (path.go).
	connConfig *pgx.ConnConfig
	relied     map[string]string
	// openPath is what CheckPath found at Open.
	openPath PathReport
}

var _ store.Store = (*Store)(nil)

// Session defaults applied unless the DSN sets them. lock_timeout bounds a
// wait for a row lock (a batch waiting longer is refused with ErrConflict
// and rerun); idle_in_transaction_session_timeout frees the locks of a
// replica that stopped mid-transaction without its connection closing (a
// frozen process, a silent network partition).
//
// plan_cache_mode force_custom_plan plans every execution of a prepared
// statement for its arguments and the tables' sizes at that moment, so no
// plan needs statistics: outside write transactions, and in them for the
// lookups by arrays of keys (plan.go, where the write transactions keep
// the other statements' cached plans). Under the default (auto)
// PostgreSQL settles on a generic plan after five executions and keeps it
// until the table's statistics change (ANALYZE: autovacuum's or an
// operator's); a plan settled on while a table was young (a never-analysed
// table counts as 10 pages) reads the whole table: the batch prefetches
// (reservations by id = ANY, heads, currents and accounts joined to
// unnest) scanned every row on every batch, for as long as the connection
// lived, which with autovacuum off is for ever (singles beside batches on
// one subject: prefetches of 0.1-4 s, 24-54 calls/s, measured for commit
// 8b13602).
var sessionDefaults = map[string]string{
	"lock_timeout":                        "5s",
	"idle_in_transaction_session_timeout": "30s",
	"application_name":                    "capledger",
	"plan_cache_mode":                     "force_custom_plan",
}

// parseConfig returns the pool configuration of dsn with the session
// defaults it leaves unset, and whether the store chooses plan_cache_mode
// per statement in write transactions (plansPerStatement).
func parseConfig(dsn string) (*pgxpool.Config, bool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, false, dsnError(err)
	}
	set := dsnSettings(cfg.ConnConfig.RuntimeParams)
	for name, value := range sessionDefaults {
		if !set[name] {
			cfg.ConnConfig.RuntimeParams[name] = value
		}
	}
	if err := requireReadWrite(dsn, cfg.ConnConfig.ValidateConnect); err != nil {
		return nil, false, err
	}
	cfg.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	return cfg, plansPerStatement(cfg, set["plan_cache_mode"]), nil
}

// dsnSettings returns the names of the settings a DSN gives the session:
// its startup parameters, and the settings inside its options parameter
// (options= in the DSN or PGOPTIONS), which the server applies after the
// startup parameters, so a session default the store sent beside them
// would win over the DSN's own value.
func dsnSettings(params map[string]string) map[string]bool {
	set := make(map[string]bool, len(params))
	for name := range params {
		// The server reads parameter names in any case (Lock_Timeout is
		// lock_timeout): a default sent beside another spelling would
		// be a second value, and either could win.
		set[strings.ToLower(name)] = true
	}
	for name := range optionsSettings(params["options"]) {
		set[name] = true
	}
	return set
}

// optionsSettings returns the settings named in a libpq options string,
// as the server reads it: words split at unescaped white space (a
// backslash escapes the next character), each setting given as
// "-c name=value", "-cname=value" or "--name=value", with '-' in a name
// read as '_'. Other switches are left out.
func optionsSettings(options string) map[string]string {
	var words []string
	var word strings.Builder
	inWord, escaped := false, false
	for _, r := range options {
		switch {
		case escaped:
			word.WriteRune(r)
			escaped = false
		case r == '\\':
			escaped, inWord = true, true
		case unicode.IsSpace(r):
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	settings := map[string]string{}
	for i := 0; i < len(words); i++ {
		var setting string
		switch w := words[i]; {
		case w == "-c" && i+1 < len(words):
			i++
			setting = words[i]
		case strings.HasPrefix(w, "--"):
			setting = w[2:]
		case strings.HasPrefix(w, "-c"):
			setting = w[2:]
		default:
			continue
		}
		name, value, ok := strings.Cut(setting, "=")
		if !ok || name == "" {
			continue
		}
		settings[strings.ToLower(strings.ReplaceAll(name, "-", "_"))] = value
	}
	return settings
}

// dsnError says what is wrong with a DSN that does not parse, without the
// DSN: pgconn's message quotes it ("cannot parse `DSN`: what (cause)"),
// password included when its best-effort redaction misses one, so only the
// part after the quote is kept. Some of pgconn's errors wrap no cause (an
// unknown target_session_attrs, a port that is no number): the part after
// the quote is all they say.
func dsnError(err error) error {
	msg := err.Error()
	if i := strings.LastIndex(msg, "`: "); strings.HasPrefix(msg, "cannot parse `") && i >= 0 {
		return fmt.Errorf("postgres dsn: %s", msg[i+len("`: "):])
	}
	if cause := errors.Unwrap(err); cause != nil {
		return fmt.Errorf("postgres dsn: %w", cause)
	}
	return errors.New("postgres dsn: it does not parse")
}

// targetSessionAttrs names the connect validators pgconn.ParseConfig sets
// for each target_session_attrs value but "any" (which sets none).
var targetSessionAttrs = map[uintptr]string{
	funcAddr(pgconn.ValidateConnectTargetSessionAttrsReadWrite):     "read-write",
	funcAddr(pgconn.ValidateConnectTargetSessionAttrsReadOnly):      "read-only",
	funcAddr(pgconn.ValidateConnectTargetSessionAttrsPrimary):       "primary",
	funcAddr(pgconn.ValidateConnectTargetSessionAttrsStandby):       "standby",
	funcAddr(pgconn.ValidateConnectTargetSessionAttrsPreferStandby): "prefer-standby",
}

func funcAddr(f pgconn.ValidateConnectFunc) uintptr { return reflect.ValueOf(f).Pointer() }

// requireReadWrite returns nil when the DSN (or PGTARGETSESSIONATTRS)
// leaves target_session_attrs unset or sets it to read-write, and an error
// saying why for any other value. The ledger writes on every command, so
// it connects only to a server that accepts writes: a DSN listing every
// member of a cluster (host=pg-a,pg-b,pg-c) then finds the primary after a
// failover and never settles on a standby. "primary" is refused too: it
// accepts a primary made read-only (default_transaction_read_only, as a
// fence), where every command would fail. validate is what
// pgconn.ParseConfig made of the setting; it is nil both for an explicit
// "any" and for no setting (libpq's default is "any"), so those are told
// apart by parsing dsn again behind a setting of its own.
func requireReadWrite(dsn string, validate pgconn.ValidateConnectFunc) error {
	value := "any"
	if validate != nil {
		value = targetSessionAttrs[funcAddr(validate)]
	} else if os.Getenv("PGTARGETSESSIONATTRS") == "" && !dsnSetsTargetSessionAttrs(dsn) {
		return nil
	}
	if value == "read-write" {
		return nil
	}
	return fmt.Errorf("postgres dsn: target_session_attrs=%s: capledger writes on every command, so it connects only to a server that accepts writes; "+
		"leave target_session_attrs out or set it to read-write", value)
}

// dsnSetsTargetSessionAttrs reports whether dsn itself sets
// target_session_attrs: it parses dsn with read-only set ahead of dsn's
// own parameters, which a setting in dsn overrides.
func dsnSetsTargetSessionAttrs(dsn string) bool {
	probe := "target_session_attrs=read-only " + dsn
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		base, query, _ := strings.Cut(dsn, "?")
		probe = base + "?target_session_attrs=read-only"
		if query != "" {
			probe += "&" + query
		}
	}
	cfg, err := pgconn.ParseConfig(probe)
	return err == nil && funcAddr(cfg.ValidateConnect) != funcAddr(pgconn.ValidateConnectTargetSessionAttrsReadOnly)
}

// Open connects to the database named by dsn (a postgres:// URL or a
// key=value string; pool_max_conns and any session parameter such as
// search_path may be given in it), applies pending migrations (see
// Migrate) and returns the store.
//
// Open then checks the connection path (CheckPath): it returns an error
// wrapping ErrPreparedStatementsLost where every command would fail, and
// keeps the session settings found not in effect (SettingsNotInEffect).
//
// Returns an error wrapping store.ErrUnavailable when the server cannot be
// reached; an error for a malformed DSN or a schema newer than this binary.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, planPerStatement, err := parseConfig(dsn)
	if err != nil {
		return nil, err
	}
	s := &Store{planPerStatement: planPerStatement, connConfig: cfg.ConnConfig.Copy(), relied: reliedSettings(cfg.ConnConfig)}
	// First the path: behind a pooler that loses prepared statements
	// migrating would fail too, with the symptom rather than the cause.
	if s.openPath, err = s.CheckPath(ctx); err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return nil, s.c.classifyConnect("open: connect", err)
	}
	_, err = migrate(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("open: migrate: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, s.c.classify("open: pool", err, false)
	}
	s.pool = pool
	s.c.onLost = s.resetOnLostServer
	return s, nil
}

// SettingsNotInEffect returns the session settings the store relies on
// that Open found not in effect as the store set them (CheckPath), for
// the caller to report.
func (s *Store) SettingsNotInEffect() []SettingNotInEffect { return s.openPath.Settings }

// Close closes every pooled connection; it waits for transactions in
// progress to end. It returns nil.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// Stats are the driver's cumulative counters since Open, and the pool's
// current state, for metrics.
type Stats struct {
	// Transactions begun, committed, and rolled back (explicitly or by an
	// error).
	Transactions, Commits, Rollbacks uint64
	// Conflicts counts every error reported as store.ErrConflict; the
	// fields after it break it down by cause.
	Conflicts             uint64
	Deadlocks             uint64 // 40P01
	SerializationFailures uint64 // 40001
	// LockNotAvailable: lock_timeout or statement_timeout expired, or a
	// row lock taken out of the fixed order (NOWAIT) was held by another
	// transaction (55P03, 57014).
	LockNotAvailable uint64
	// Duplicates counts unique violations (store.ErrDuplicate).
	Duplicates uint64
	// Unavailable counts errors reported as store.ErrUnavailable;
	// CommitUnknown those of them raised by COMMIT (outcome unknown).
	Unavailable, CommitUnknown uint64
	// CheckViolations counts transactions the database refused because a
	// term would turn negative or an account would not balance: each one
	// is a bug upstream, caught before it was stored.
	CheckViolations uint64
	// Pool state.
	PoolMaxConns, PoolTotalConns, PoolIdleConns, PoolAcquiredConns int32
	PoolAcquireWait                                                time.Duration
}

// Stats returns the counters now.
func (s *Store) Stats() Stats {
	ps := s.pool.Stat()
	return Stats{
		Transactions: s.c.transactions.Load(), Commits: s.c.commits.Load(), Rollbacks: s.c.rollbacks.Load(),
		Conflicts: s.c.conflicts.Load(), Deadlocks: s.c.deadlocks.Load(), SerializationFailures: s.c.serialization.Load(),
		LockNotAvailable: s.c.lockNotAvailable.Load(),
		Duplicates:       s.c.duplicates.Load(), Unavailable: s.c.unavailable.Load(), CommitUnknown: s.c.commitUnknown.Load(),
		CheckViolations: s.c.checkViolations.Load(),
		PoolMaxConns:    ps.MaxConns(), PoolTotalConns: ps.TotalConns(), PoolIdleConns: ps.IdleConns(),
		PoolAcquiredConns: ps.AcquiredConns(), PoolAcquireWait: ps.AcquireDuration(),
	}
}

// Ping checks that the database answers; it returns nil or an error wrapping
// store.ErrUnavailable (health checks).
func (s *Store) Ping(ctx context.Context) error {
	return s.c.classify("ping", s.pool.Ping(ctx), false)
}

// querier is what reads run on: the pool (committed state) or a
// transaction (locked rows).
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReservationGet returns the committed reservation, or ErrNotFound.
func (s *Store) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	r, err := s.reservationGet(ctx, s.pool, id, lockNone)
	if err != nil {
		return ledger.Reservation{}, err
	}
	return *r, nil
}

// AccountGet returns the committed account, or ErrNotFound.
func (s *Store) AccountGet(ctx context.Context, key ledger.AccountKey) (ledger.Account, error) {
	a, _, err := s.accountGet(ctx, s.pool, key, lockNone)
	if err != nil {
		return ledger.Account{}, err
	}
	return *a, nil
}

// AccountList returns the accounts of a subject key (every generation),
// ordered by generation; an empty Subject lists every account, ordered by
// key.
func (s *Store) AccountList(ctx context.Context, subject ledger.PolicyKey) ([]ledger.Account, error) {
	var rows pgx.Rows
	var err error
	if subject.Subject == "" {
		rows, err = s.pool.Query(ctx, accountSelect+` ORDER BY a.subject, a.route, a.region, a.generation, t.dim`)
	} else {
		rows, err = s.pool.Query(ctx, accountSelect+` WHERE a.subject = $1 AND a.route = $2 AND a.region = $3
			ORDER BY a.generation, t.dim`, subject.Subject, subject.Route, subject.Region)
	}
	if err != nil {
		return nil, s.c.classify("account list", err, false)
	}
	accounts, _, err := scanAccounts(rows)
	if err != nil {
		return nil, s.c.classify("account list", err, false)
	}
	return accounts, nil
}

// accountsOfSubjectsSQL reads the accounts of the subject keys given as
// parallel arrays ($1, $2, $3: distinct keys), with their term rows, in
// key order with text compared as bytes (COLLATE "C", as Go compares
// strings): the keys drive the join, one seek of the accounts' unique
// key each, as the batch prefetch's lookups do. Outside write
// transactions it is planned at each run (plan.go), for the keys' count.
const accountsOfSubjectsSQL = accountSelect + `
	JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(subject, route, region)
	ON a.subject = k.subject AND a.route = k.route AND a.region = k.region
	ORDER BY a.subject COLLATE "C", a.route COLLATE "C", a.region COLLATE "C", a.generation, t.dim`

// AccountsOfSubjects returns the accounts of subjects (every generation
// of each) in key order, in one query; a key with an empty Subject names
// none, and none found is an empty list.
func (s *Store) AccountsOfSubjects(ctx context.Context, subjects []ledger.PolicyKey) ([]ledger.Account, error) {
	keys := slices.DeleteFunc(slices.Clone(subjects), func(k ledger.PolicyKey) bool { return k.Subject == "" })
	if len(keys) == 0 {
		return nil, nil
	}
	slices.SortFunc(keys, ledger.PolicyKey.Compare)
	keys = slices.Compact(keys)
	subj, route, region := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		subj[i], route[i], region[i] = k.Subject, k.Route, k.Region
	}
	rows, err := s.pool.Query(ctx, accountsOfSubjectsSQL, subj, route, region)
	if err != nil {
		return nil, s.c.classify("accounts of subjects", err, false)
	}
	accounts, _, err := scanAccounts(rows)
	if err != nil {
		return nil, s.c.classify("accounts of subjects", err, false)
	}
	return accounts, nil
}

// PolicyGet returns one committed generation, or ErrNotFound.
func (s *Store) PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error) {
	p, err := s.policyGet(ctx, s.pool, generation, lockNone)
	if err != nil {
		return ledger.Policy{}, err
	}
	return *p, nil
}

// PoliciesOfGenerations returns the committed policies of generations,
// by generation; one that does not exist (above math.MaxInt64 none does)
// is absent. One statement, one round trip, however many generations (an
// array, not one bind parameter each): a seek of the primary key each.
func (s *Store) PoliciesOfGenerations(ctx context.Context, generations []uint64) (map[uint64]ledger.Policy, error) {
	return s.policiesOf(ctx, s.pool, generations)
}

// policiesOf is PoliciesOfGenerations in q (a snapshot's transaction:
// ledger.Snapshot.PoliciesOf).
func (s *Store) policiesOf(ctx context.Context, q querier, generations []uint64) (map[uint64]ledger.Policy, error) {
	distinct := make([]int64, 0, len(generations))
	for _, g := range generations {
		if g <= math.MaxInt64 {
			distinct = append(distinct, int64(g))
		}
	}
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	out := make(map[uint64]ledger.Policy, len(distinct))
	if len(distinct) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, policiesOfSQL, distinct)
	if err != nil {
		return nil, s.c.classify("policies of generations", err, false)
	}
	defer rows.Close()
	for rows.Next() {
		p, err := scanPolicy(rows)
		if err != nil {
			return nil, s.c.classify("policies of generations", err, false)
		}
		out[p.Generation] = *p
	}
	if err := rows.Err(); err != nil {
		return nil, s.c.classify("policies of generations", err, false)
	}
	return out, nil
}

// PolicyHead returns a policy key's committed head, or ErrNotFound.
func (s *Store) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	var active, latest int64
	err := s.pool.QueryRow(ctx, `SELECT active, latest FROM policy_heads WHERE subject = $1 AND route = $2 AND region = $3`,
		key.Subject, key.Route, key.Region).Scan(&active, &latest)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.PolicyHead{}, notFound("policy head " + key.String())
	}
	if err != nil {
		return ledger.PolicyHead{}, s.c.classify("policy head "+key.String(), err, false)
	}
	var conv codecConv
	h := ledger.PolicyHead{Key: key, Active: conv.Uint(active), Latest: conv.Uint(latest)}
	if err := conv.Err(); err != nil {
		return ledger.PolicyHead{}, fmt.Errorf("policy head %s: %w", key, err)
	}
	return h, nil
}

// policyHeadsSQL reads the committed heads of the keys of three text
// arrays (subject, route, region), in one statement: the keys drive the
// join, one seek of the heads' primary key each. Outside write
// transactions it is planned at each run (plan.go), for the keys' count.
const policyHeadsSQL = `SELECT h.subject, h.route, h.region, h.active, h.latest
	FROM unnest($1::text[], $2::text[], $3::text[]) AS k(subject, route, region)
	JOIN policy_heads h ON h.subject = k.subject AND h.route = k.route AND h.region = k.region`

// PolicyHeads returns the committed heads of keys, by key; a key without
// a head is absent. One statement, one round trip, however many keys
// (arrays, not one bind parameter per key).
func (s *Store) PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	return s.headsOf(ctx, s.pool, keys)
}

// headsOf is PolicyHeads in q (a view's transaction: AccountsView).
func (s *Store) headsOf(ctx context.Context, q querier, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	distinct := slices.Clone(keys)
	slices.SortFunc(distinct, ledger.PolicyKey.Compare)
	distinct = slices.Compact(distinct)
	out := make(map[ledger.PolicyKey]ledger.PolicyHead, len(distinct))
	if len(distinct) == 0 {
		return out, nil
	}
	subj, route, region := make([]string, len(distinct)), make([]string, len(distinct)), make([]string, len(distinct))
	for i, k := range distinct {
		subj[i], route[i], region[i] = k.Subject, k.Route, k.Region
	}
	rows, err := q.Query(ctx, policyHeadsSQL, subj, route, region)
	if err != nil {
		return nil, s.c.classify("policy heads", err, false)
	}
	defer rows.Close()
	for rows.Next() {
		var k ledger.PolicyKey
		var active, latest int64
		if err := rows.Scan(&k.Subject, &k.Route, &k.Region, &active, &latest); err != nil {
			return nil, s.c.classify("policy heads", err, false)
		}
		var conv codecConv
		h := ledger.PolicyHead{Key: k, Active: conv.Uint(active), Latest: conv.Uint(latest)}
		if err := conv.Err(); err != nil {
			return nil, fmt.Errorf("policy head %s: %w", k, err)
		}
		out[k] = h
	}
	if err := rows.Err(); err != nil {
		return nil, s.c.classify("policy heads", err, false)
	}
	return out, nil
}

// PolicyList returns every generation, oldest first.
func (s *Store) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	return s.policyList(ctx, s.pool, 0)
}

// PolicyListAfter returns the generations newer than after, oldest first.
func (s *Store) PolicyListAfter(ctx context.Context, after uint64) ([]ledger.Policy, error) {
	if after > math.MaxInt64 {
		return nil, nil
	}
	return s.policyList(ctx, s.pool, int64(after))
}

// PolicyChanges returns the committed ledger.MetaPolicyChanges row, 0
// when it was never set.
func (s *Store) PolicyChanges(ctx context.Context) (uint64, error) {
	var v int64
	err := s.pool.QueryRow(ctx, `SELECT value FROM meta WHERE name = $1`, ledger.MetaPolicyChanges).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, s.c.classify("meta "+ledger.MetaPolicyChanges, err, false)
	}
	return uint64(v), nil
}

// policyPageSQL reads a page of PolicyPage, each row's key's active
// generation from its head in the same statement (one snapshot). Read
// outside write transactions, it is planned at each run (plan.go), for
// the filters given: with a subject, a range of policies_key.
var policyPageSQL = strings.Replace(policySelect, " FROM policies", `, (SELECT h.active FROM policy_heads h
		WHERE h.subject = policies.subject AND h.route = policies.route AND h.region = policies.region) FROM policies`, 1) + `
		WHERE generation > $1 AND ($2 = '' OR subject = $2) AND ($3 = '' OR route = $3) AND ($4 = '' OR region = $4)
		ORDER BY generation LIMIT $5`

// policiesOfSQL reads PoliciesOfGenerations' policies: a seek of the
// primary key per generation.
const policiesOfSQL = policySelect + ` WHERE generation = ANY($1::bigint[])`

// PolicyPage returns up to f.Limit generations newer than f.After that
// f's filters select, oldest first, each with whether its key's head
// names it active (store.Store.PolicyPage): a range of the primary key.
func (s *Store) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("policy page: limit %d is not positive", f.Limit)
	}
	if f.After > math.MaxInt64 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, policyPageSQL, int64(f.After), f.Subject, f.Route, f.Region, f.Limit)
	if err != nil {
		return nil, s.c.classify("policy page", err, false)
	}
	defer rows.Close()
	var out []store.ListedPolicy
	for rows.Next() {
		var active *int64
		p, err := scanPolicy(withColumn{rows, &active})
		if err != nil {
			return nil, s.c.classify("policy page", err, false)
		}
		out = append(out, store.ListedPolicy{Policy: *p, Active: active != nil && *active == int64(p.Generation)})
	}
	return out, s.c.classify("policy page", rows.Err(), false)
}

// withColumn is a pgx.Row whose rows have one more column after the
// ones its caller scans, into extra.
type withColumn struct {
	row   pgx.Row
	extra any
}

func (w withColumn) Scan(dest ...any) error { return w.row.Scan(append(dest, w.extra)...) }

func (s *Store) policyList(ctx context.Context, q querier, after int64) ([]ledger.Policy, error) {
	rows, err := q.Query(ctx, policySelect+` WHERE generation > $1 ORDER BY generation`, after)
	if err != nil {
		return nil, s.c.classify("policy list", err, false)
	}
	defer rows.Close()
	var out []ledger.Policy
	for rows.Next() {
		p, err := scanPolicy(rows)
		if err != nil {
			return nil, s.c.classify("policy list", err, false)
		}
		out = append(out, *p)
	}
	return out, s.c.classify("policy list", rows.Err(), false)
}

// ShardGet returns one committed shard, or ErrNotFound.
func (s *Store) ShardGet(ctx context.Context, id string) (ledger.Shard, error) {
	sh, err := s.shardGet(ctx, s.pool, id, lockNone)
	if err != nil {
		return ledger.Shard{}, err
	}
	return *sh, nil
}

// ShardList returns every shard, ordered by id.
func (s *Store) ShardList(ctx context.Context) ([]ledger.Shard, error) {
	return s.shardList(ctx, s.pool)
}

func (s *Store) shardList(ctx context.Context, q querier) ([]ledger.Shard, error) {
	rows, err := q.Query(ctx, shardSelect+` ORDER BY id`)
	if err != nil {
		return nil, s.c.classify("shard list", err, false)
	}
	defer rows.Close()
	var out []ledger.Shard
	read := 0
	for rows.Next() {
		read++
		store.RowRead(ctx, read) // a bounded audit waits anew while rows arrive
		sh, err := scanShard(rows)
		if err != nil {
			return nil, s.c.classify("shard list", err, false)
		}
		out = append(out, *sh)
	}
	return out, s.c.classify("shard list", rows.Err(), false)
}

// dueSQL reads what is due by time up to $1 through reservations_due,
// and the EXPIRING rows still ahead of it through the small
// reservations_expiring index (the state is a literal so that the planner
// can match that partial index).
var dueSQL = fmt.Sprintf(`SELECT id, state, due_at FROM (
		(SELECT id, state, due_at FROM reservations WHERE due_at IS NOT NULL AND due_at <= $1 ORDER BY due_at, id LIMIT $2)
		UNION ALL
		(SELECT id, state, due_at FROM reservations WHERE state = %d AND due_at > $1 ORDER BY due_at, id LIMIT $2)
	) due ORDER BY due_at, id LIMIT $2`, ledger.StateExpiring)

// ReservationsDue returns up to limit reservations that need a worker at
// now (RESERVED past ExpiresAt, EXPIRING, STARTED past a non-zero
// ExecutionDeadline), each with its state and due time (the generated
// due_at), the longest overdue first. An EXPIRING reservation is due
// whatever now is: its claim already found the hold run out.
func (s *Store) ReservationsDue(ctx context.Context, now time.Time, limit int) ([]store.DueReservation, error) {
	if limit <= 0 {
		return nil, nil
	}
	var conv codecConv
	at := conv.Nanos(now)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("reservations due: %w", err)
	}
	rows, err := s.pool.Query(ctx, dueSQL, at, limit)
	if err != nil {
		return nil, s.c.classify("reservations due", err, false)
	}
	due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.DueReservation, error) {
		var (
			d     store.DueReservation
			state int16
			dueAt int64
		)
		if err := row.Scan(&d.ID, &state, &dueAt); err != nil {
			return d, err
		}
		d.State, d.DueAt = ledger.State(state), conv.Time(dueAt)
		return d, nil
	})
	return due, s.c.classify("reservations due", err, false)
}

// unknownSQL returns ReservationsUnknown's query for f, with its
// arguments. It reads the partial index reservations_usage_unknown_at
// (unknown_at, id WHERE state = 8; the state is a literal so the planner
// can match that predicate) in order from the cursor and stops after the
// limit. Clauses are left out rather than disabled by a parameter, so
// that a generic plan of the prepared statement still seeks the index at
// the cursor: at most eight texts, each prepared once per connection.
func unknownSQL(f store.UnknownFilter, after int64) (string, []any) {
	var b strings.Builder
	args := []any{}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	fmt.Fprintf(&b, "%s WHERE state = %d", reservationSelect, ledger.StateUsageUnknown)
	if f.After != (store.UnknownCursor{}) {
		fmt.Fprintf(&b, " AND (unknown_at, id) > (%s::bigint, %s::text)", arg(after), arg(f.After.ID))
	}
	if f.Subject != "" {
		fmt.Fprintf(&b, " AND subject = %s", arg(f.Subject))
	}
	if f.Route != "" {
		fmt.Fprintf(&b, " AND route = %s", arg(f.Route))
	}
	fmt.Fprintf(&b, " ORDER BY unknown_at, id LIMIT %s", arg(f.Limit))
	return b.String(), args
}

// ReservationsUnknown returns up to f.Limit USAGE_UNKNOWN reservations in
// (UnknownAt, ID) order, strictly after f.After unless it is the zero
// cursor, with f's subject and route when they are not empty; none is an
// empty list. It returns an error for f.Limit <= 0 and for a cursor time
// no row can hold (one codec.Conv.Nanos refuses). Ties on
// UnknownAt are ordered by id in the column's collation, the same order
// the cursor compares in, so paging neither skips nor repeats a row.
func (s *Store) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("reservations unknown: limit %d is not positive", f.Limit)
	}
	var conv codecConv
	after := conv.Nanos(f.After.MarkedAt)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("reservations unknown: cursor: %w", err)
	}
	query, args := unknownSQL(f, after)
	return s.reservationsQuery(ctx, s.pool, "reservations unknown", query, args...)
}

// unknownBacklogSQL counts the entries of reservations_usage_unknown_at (an
// index-only scan where the visibility map allows); min of no rows is
// NULL, read as 0, the zero time.
var unknownBacklogSQL = fmt.Sprintf(`SELECT count(*), COALESCE(min(unknown_at), 0) FROM reservations WHERE state = %d`,
	ledger.StateUsageUnknown)

// ReservationsUnknownBacklog returns how many reservations are
// USAGE_UNKNOWN and the earliest UnknownAt among them (the zero time when
// there are none), from the partial index reservations_usage_unknown_at.
func (s *Store) ReservationsUnknownBacklog(ctx context.Context) (store.UnknownBacklog, error) {
	var (
		b      store.UnknownBacklog
		oldest int64
		conv   codecConv
	)
	if err := s.pool.QueryRow(ctx, unknownBacklogSQL).Scan(&b.Count, &oldest); err != nil {
		return store.UnknownBacklog{}, s.c.classify("reservations unknown backlog", err, false)
	}
	b.OldestMarkedAt = conv.Time(oldest)
	return b, nil
}

// AccountsInDebtCount counts the accounts flagged in_debt, through the
// partial index accounts_in_debt (its predicate repeated, so the planner
// can match it): an index (only) scan of the debtors' entries, whatever
// the number of other accounts.
func (s *Store) AccountsInDebtCount(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM accounts WHERE in_debt`).Scan(&n); err != nil {
		return 0, s.c.classify("accounts in debt count", err, false)
	}
	return n, nil
}

// debtSQL returns AccountsInDebt's query, with the cursor clause when
// after is set: $1 is the limit, $2 to $5 the cursor key. The inner
// SELECT reads the partial index accounts_in_debt (the keys of the
// accounts with a term row in debt, schema 12: its predicate is repeated
// so the planner can match it) in order from the cursor and stops after
// $1 entries; the LATERAL one reads each of those accounts' term rows by
// primary key, decoded as AccountGet's are. A page costs what it returns,
// however many accounts owe (TestDebtQueriesUseTheirIndex checks the
// plan). It is one statement, one snapshot.
//
// The term rows are read by a LATERAL subquery with a LIMIT (an account
// has at most ledger.MaxDimensions of them) on purpose: a generic plan
// does not know the page's limit and estimates a tenth of the debtors per
// page, and with thousands of them a plain join (or a LATERAL one the
// planner may flatten into it) plans a hash join over a scan of every
// term row. The LIMIT keeps the subquery apart: it runs once per account
// of the page, by primary key.
//
// Keys compare as bytes (COLLATE "C", the index's collation), the order
// Go and the SQLite store use. The cursor clause is left out rather than
// disabled by a parameter, so that a generic plan of the prepared
// statement still seeks the index at the cursor.
func debtSQL(after bool) string {
	cursor := ""
	if after {
		cursor = `
			AND (d.subject COLLATE "C", d.route COLLATE "C", d.region COLLATE "C", d.generation) >
				($2::text COLLATE "C", $3::text COLLATE "C", $4::text COLLATE "C", $5::bigint)`
	}
	return accountSelectColumns + ` FROM (SELECT d.* FROM accounts d WHERE d.in_debt` + cursor + `
		ORDER BY d.subject COLLATE "C", d.route COLLATE "C", d.region COLLATE "C", d.generation LIMIT $1) a
	CROSS JOIN LATERAL (SELECT * FROM account_terms o WHERE o.account_id = a.id ORDER BY o.dim LIMIT ` + fmt.Sprint(ledger.MaxDimensions) + `) t
	ORDER BY a.subject COLLATE "C", a.route COLLATE "C", a.region COLLATE "C", a.generation, t.dim`
}

var (
	debtFirstSQL = debtSQL(false)
	debtAfterSQL = debtSQL(true)
)

// AccountsInDebt returns up to f.Limit accounts with a term row in debt
// (overdraft_issued > overdraft_repaid, any dimension stored: accounts.in_debt,
// kept by triggers on account_terms), in key order, strictly after
// f.After unless it is the zero key; none is an empty list. It returns an
// error for f.Limit <= 0 and for a cursor generation above
// math.MaxInt64. Text columns order, and the cursor compares, as bytes
// (COLLATE "C") whatever the database's collation, so paging neither
// skips nor repeats an account.
func (s *Store) AccountsInDebt(ctx context.Context, f store.DebtFilter) ([]ledger.Account, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("accounts in debt: limit %d is not positive", f.Limit)
	}
	var conv codecConv
	generation := conv.Int(f.After.Generation)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("accounts in debt: cursor %s: %w", f.After, err)
	}
	var (
		rows pgx.Rows
		err  error
	)
	if f.After == (ledger.AccountKey{}) {
		rows, err = s.pool.Query(ctx, debtFirstSQL, f.Limit)
	} else {
		rows, err = s.pool.Query(ctx, debtAfterSQL, f.Limit, f.After.Subject, f.After.Route, f.After.Region, generation)
	}
	if err != nil {
		return nil, s.c.classify("accounts in debt", err, false)
	}
	accounts, _, err := scanAccounts(rows)
	if err != nil {
		return nil, s.c.classify("accounts in debt", err, false)
	}
	return accounts, nil
}

// pageSQL returns AccountsPage's query, with the cursor clause when after
// is set ($1 the limit, $2 to $5 the cursor key): the inner SELECT seeks
// the accounts' unique key at the cursor and stops after $1 accounts;
// the LATERAL one reads each one's term rows by primary key (as debtSQL,
// whose comments say why). Keys order, and the cursor compares, in the
// database's collation, the unique key's, as AccountList orders every
// account.
func pageSQL(after bool) string {
	cursor := ""
	if after {
		cursor = `
			WHERE (d.subject, d.route, d.region, d.generation) > ($2::text, $3::text, $4::text, $5::bigint)`
	}
	return accountSelectColumns + ` FROM (SELECT d.* FROM accounts d` + cursor + `
		ORDER BY d.subject, d.route, d.region, d.generation LIMIT $1) a
	CROSS JOIN LATERAL (SELECT * FROM account_terms o WHERE o.account_id = a.id ORDER BY o.dim LIMIT ` + fmt.Sprint(ledger.MaxDimensions) + `) t
	ORDER BY a.subject, a.route, a.region, a.generation, t.dim`
}

// pageOfSubjectSQL returns AccountsPage's query of one subject, with the
// cursor clause when after is set: pageSQL's, the inner SELECT reading
// the subject's range of the accounts' unique key only (whatever the
// other subjects' accounts), its route and region matched when not
// empty. Parameters: $1 the limit; with after, $2 to $5 the cursor key,
// then the subject, route and region ($6 to $8; without, $2 to $4).
func pageOfSubjectSQL(after bool) string {
	filter, n := "", 2
	if after {
		filter, n = `(d.subject, d.route, d.region, d.generation) > ($2::text, $3::text, $4::text, $5::bigint) AND `, 6
	}
	filter += fmt.Sprintf(`d.subject = $%d::text AND ($%d::text = '' OR d.route = $%[2]d) AND ($%d::text = '' OR d.region = $%[3]d)`, n, n+1, n+2)
	return accountSelectColumns + ` FROM (SELECT d.* FROM accounts d
		WHERE ` + filter + `
		ORDER BY d.subject, d.route, d.region, d.generation LIMIT $1) a
	CROSS JOIN LATERAL (SELECT * FROM account_terms o WHERE o.account_id = a.id ORDER BY o.dim LIMIT ` + fmt.Sprint(ledger.MaxDimensions) + `) t
	ORDER BY a.subject, a.route, a.region, a.generation, t.dim`
}

// pageOfRouteSQL returns AccountsPage's query of one route's accounts
// without a subject: pageSQL's, the inner SELECT reading the route's
// range of accounts_by_route (schema 20) only, whatever the other
// routes' accounts, from strictly after (subject, region, generation)
// (store.AccountFilter.RouteSeek; the route's key order), or with past
// from the first account of a subject after the cursor's, its region
// matched when not empty. Parameters: $1 the limit, $2 the route, $3 the
// cursor's subject, then without past $4 its region and $5 its
// generation, and last the region filter ($6; with past, $4).
func pageOfRouteSQL(past bool) string {
	filter := `d.route = $2::text AND (d.subject, d.region, d.generation) > ($3::text, $4::text, $5::bigint) AND ($6::text = '' OR d.region = $6)`
	if past {
		filter = `d.route = $2::text AND d.subject > $3::text AND ($4::text = '' OR d.region = $4)`
	}
	return accountSelectColumns + ` FROM (SELECT d.* FROM accounts d
		WHERE ` + filter + `
		ORDER BY d.route, d.subject, d.region, d.generation LIMIT $1) a
	CROSS JOIN LATERAL (SELECT * FROM account_terms o WHERE o.account_id = a.id ORDER BY o.dim LIMIT ` + fmt.Sprint(ledger.MaxDimensions) + `) t
	ORDER BY a.subject, a.route, a.region, a.generation, t.dim`
}

var (
	pageOfRouteSQLText     = pageOfRouteSQL(false)
	pageOfRoutePastSQLText = pageOfRouteSQL(true)
	pageFirstSQL           = pageSQL(false)
	pageAfterSQL           = pageSQL(true)
	pageOfSubjectFirstSQL  = pageOfSubjectSQL(false)
	pageOfSubjectAfterSQL  = pageOfSubjectSQL(true)
)

// AccountsPage returns up to f.Limit accounts that f selects, in key
// order after f.After (store.Store.AccountsPage), each page one
// statement: with a subject, a range of its accounts only; with a route
// and no subject, a range of accounts_by_route.
func (s *Store) AccountsPage(ctx context.Context, f store.AccountFilter) ([]ledger.Account, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("accounts page: limit %d is not positive", f.Limit)
	}
	var conv codecConv
	generation := conv.Int(f.After.Generation)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("accounts page: cursor %s: %w", f.After, err)
	}
	if err := f.Problem(); err != nil {
		return nil, fmt.Errorf("accounts page: %w", err)
	}
	var (
		rows pgx.Rows
		err  error
	)
	switch first := f.After == (ledger.AccountKey{}); {
	case f.OfRoute():
		subject, region, after, past := f.RouteSeek()
		if past {
			rows, err = s.pool.Query(ctx, pageOfRoutePastSQLText, f.Limit, f.Route, subject, f.Region)
		} else {
			rows, err = s.pool.Query(ctx, pageOfRouteSQLText, f.Limit, f.Route, subject, region, after, f.Region)
		}
	case f.Subject != "" && first:
		rows, err = s.pool.Query(ctx, pageOfSubjectFirstSQL, f.Limit, f.Subject, f.Route, f.Region)
	case f.Subject != "":
		rows, err = s.pool.Query(ctx, pageOfSubjectAfterSQL, f.Limit, f.After.Subject, f.After.Route, f.After.Region, generation,
			f.Subject, f.Route, f.Region)
	case first:
		rows, err = s.pool.Query(ctx, pageFirstSQL, f.Limit)
	default:
		rows, err = s.pool.Query(ctx, pageAfterSQL, f.Limit, f.After.Subject, f.After.Route, f.After.Region, generation)
	}
	if err != nil {
		return nil, s.c.classify("accounts page", err, false)
	}
	accounts, _, err := scanAccounts(rows)
	if err != nil {
		return nil, s.c.classify("accounts page", err, false)
	}
	return accounts, nil
}

// Snapshot reads every row in one REPEATABLE READ, read-only transaction,
// so the audit sees one consistent state while writers go on.
func (s *Store) Snapshot(ctx context.Context) (*ledger.Snapshot, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, s.c.classify("snapshot: begin", err, false)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	snap, err := s.snapshotRows(ctx, tx, true)
	if err != nil {
		return nil, err
	}
	var after int64
	if last := snap.LastCheckpoint(); last != nil {
		after = last.Through
	}
	if snap.Journal, err = s.journalList(ctx, tx, after); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, s.c.classify("snapshot: end", err, false)
	}
	return snap, nil
}

func notFound(what string) error { return fmt.Errorf("%s: %w", what, store.ErrNotFound) }

// owingOfSubjectsSQL reads, for the subject keys given as parallel
// arrays ($1, $2, $3: distinct keys; $4 each one's owing-set name, $5
// and $6 the range of the names under it), each one's current pointer
// ('c') and owing-set Meta rows ('m'): a seek of account_currents' key
// and of meta's per key, in one round trip.
const owingOfSubjectsSQL = `WITH k AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
	AS k(subject, route, region, name, lo, hi))
SELECT k.subject, k.route, k.region, 'c', '', c.generation FROM k
	JOIN account_currents c ON c.subject = k.subject AND c.route = k.route AND c.region = k.region
UNION ALL SELECT k.subject, k.route, k.region, 'm', m.name, m.value FROM k JOIN meta m ON m.name = k.name
UNION ALL SELECT k.subject, k.route, k.region, 'm', m.name, m.value FROM k
	JOIN meta m ON m.name COLLATE "C" >= k.lo AND m.name COLLATE "C" < k.hi`

// AccountsView returns the store.AccountsView of subjects
// (store.ReadAccountsView) from one REPEATABLE READ, read-only
// transaction (one snapshot, taken at its first query): the accounts'
// query, then the owing rows', the heads' and the policies'.
func (s *Store) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	if !slices.ContainsFunc(subjects, func(k ledger.PolicyKey) bool { return k.Subject != "" }) {
		return store.ReadAccountsView(ctx, nil, store.ViewReads{})
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return store.AccountsView{}, s.c.classify("accounts view: begin", err, false)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	view, err := store.ReadAccountsView(ctx, subjects, store.ViewReads{
		Accounts: func(keys []ledger.PolicyKey) ([]ledger.Account, error) {
			subj, route, region := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
			for i, k := range keys {
				subj[i], route[i], region[i] = k.Subject, k.Route, k.Region
			}
			rows, err := tx.Query(ctx, accountsOfSubjectsSQL, subj, route, region)
			if err != nil {
				return nil, s.c.classify("accounts view", err, false)
			}
			accounts, _, err := scanAccounts(rows)
			if err != nil {
				return nil, s.c.classify("accounts view", err, false)
			}
			return accounts, nil
		},
		Owing: func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]store.SubjectOwing, error) {
			return s.owingOfKeys(ctx, tx, keys)
		},
		Heads: func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
			return s.headsOf(ctx, tx, keys)
		},
		Policies: func(generations []uint64) (map[uint64]ledger.Policy, error) {
			return s.policiesOf(ctx, tx, generations)
		},
	})
	if err != nil {
		return store.AccountsView{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return store.AccountsView{}, s.c.classify("accounts view: end", err, false)
	}
	return view, nil
}

// owingOfKeys reads the current pointers and owing-set Meta rows of keys
// (distinct, not empty) by subject key, in one query on tx.
func (s *Store) owingOfKeys(ctx context.Context, tx pgx.Tx, keys []ledger.PolicyKey) (map[ledger.PolicyKey]store.SubjectOwing, error) {
	out := map[ledger.PolicyKey]store.SubjectOwing{}
	cols := make([][]string, 6)
	for i := range cols {
		cols[i] = make([]string, len(keys))
	}
	for i, k := range keys {
		base := ledger.OwingMetaName(k)
		cols[0][i], cols[1][i], cols[2][i] = k.Subject, k.Route, k.Region
		cols[3][i], cols[4][i], cols[5][i] = base, base+"/", store.PrefixEnd(base+"/")
	}
	rows, err := tx.Query(ctx, owingOfSubjectsSQL, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])
	if err != nil {
		return nil, s.c.classify("owing of subjects", err, false)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key        ledger.PolicyKey
			kind, name string
			value      int64
		)
		if err := rows.Scan(&key.Subject, &key.Route, &key.Region, &kind, &name, &value); err != nil {
			return nil, s.c.classify("owing of subjects", err, false)
		}
		o := out[key]
		if kind == "c" {
			if value < 0 {
				return nil, fmt.Errorf("owing of subjects: current generation %d of %s", value, key)
			}
			o.Current, o.HasCurrent = uint64(value), true
		} else {
			if o.Meta == nil {
				o.Meta = map[string]int64{}
			}
			o.Meta[name] = value
		}
		out[key] = o
	}
	if err := rows.Err(); err != nil {
		return nil, s.c.classify("owing of subjects", err, false)
	}
	return out, nil
}
