package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Checking the connection path.
//
// The store relies on two things of its connections that a pooler in
// transaction mode (PgBouncer) between it and PostgreSQL takes away,
// each without a word at connect:
//   - named prepared statements (pgx's default query exec mode,
//     cache_statement, prepares each statement once per connection): the
//     next transaction runs on another server connection, where the
//     statement does not exist (SQLSTATE 26000), or on one where another
//     client prepared the same name (42P05). PgBouncer 1.21 or newer with
//     max_prepared_statements tracks them per client; older ones do not;
//   - the session settings it sends at connect (sessionDefaults, or the
//     DSN's own values): PgBouncer refuses startup parameters it does not
//     know unless ignore_startup_parameters lists them, and then drops
//     them, so lock waits are no longer bounded.
//
// CheckPath looks for both on connections of their own, as the pool's
// connections are configured: Open refuses a path where commands would
// all fail, and reports settings not in effect for the caller to log.

// ErrPreparedStatementsLost is wrapped by the error of Open and CheckPath
// when a named prepared statement does not survive from one transaction
// to the next on the connection path: every command would fail.
var ErrPreparedStatementsLost = errors.New("named prepared statements do not survive from one transaction to the next on this connection path (a pooler in transaction mode?): " +
	"add default_query_exec_mode=exec to the DSN, or use PgBouncer 1.21 or newer with max_prepared_statements set")

// codeDuplicatePrepared and codeInvalidStatementName are what a named
// statement meets on a server connection it was not prepared on: another
// client's statement of the same name, or none.
const (
	codeDuplicatePrepared    = "42P05"
	codeInvalidStatementName = "26000"
)

// preparedWaitBeforeRelease bounds how long the check waits for its
// statement's execution while its other connection holds a transaction:
// behind a pooler of one server connection the execution waits for it.
const preparedWaitBeforeRelease = time.Second

// SettingNotInEffect is a session setting the store relies on that a
// connection of the path does not have as the store set it.
type SettingNotInEffect struct {
	Name string // e.g. lock_timeout
	Want string // what the store sent (its default, or the DSN's value)
	Seen string // current_setting on a connection of the path
	Role string // the role the connection runs as, for the fix
}

// Fix is the statement that makes the setting hold on every connection
// whatever the path drops: the role's own default.
func (s SettingNotInEffect) Fix() string {
	role := s.Role
	if !plainIdentifier(role) {
		role = pgx.Identifier{role}.Sanitize()
	}
	return fmt.Sprintf("ALTER ROLE %s SET %s = '%s'", role, s.Name, strings.ReplaceAll(s.Want, "'", "''"))
}

// plainIdentifier reports whether name needs no quotes in SQL: lower
// case letters, digits and underscores, not starting with a digit.
func plainIdentifier(name string) bool {
	for i, r := range name {
		if !(r >= 'a' && r <= 'z' || r == '_' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return name != ""
}

func (s SettingNotInEffect) String() string {
	return fmt.Sprintf("%s is %q on the connections, not %q as the store sets it (a pooler dropping startup parameters?): %s", s.Name, s.Seen, s.Want, s.Fix())
}

// PathReport is what CheckPath found short of an error.
type PathReport struct {
	// Settings not in effect as the store set them; empty when all are.
	Settings []SettingNotInEffect
}

// reliedSettings returns the session settings the store relies on with
// the values it asks for on connections configured by cfg (the DSN's own,
// in its options parameter or as a parameter, else sessionDefaults):
// lock_timeout and idle_in_transaction_session_timeout always, and
// plan_cache_mode where pgx keeps named prepared statements (plan.go).
func reliedSettings(cfg *pgx.ConnConfig) map[string]string {
	names := []string{"lock_timeout", "idle_in_transaction_session_timeout"}
	if cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		names = append(names, "plan_cache_mode")
	}
	options := optionsSettings(cfg.RuntimeParams["options"])
	want := make(map[string]string, len(names))
	for _, name := range names {
		if v, ok := options[name]; ok {
			want[name] = v // the server applies options after the parameters
			continue
		}
		for param, v := range cfg.RuntimeParams {
			if strings.EqualFold(param, name) {
				want[name] = v
			}
		}
	}
	return want
}

// CheckPath checks that commands can run on the connection path, on two
// connections of its own: that a named prepared statement survives from
// one transaction to the next (when pgx prepares named statements), and
// that the session settings the store relies on are in effect. It
// returns an error wrapping ErrPreparedStatementsLost when they do not
// survive, one wrapping store.ErrUnavailable when the server cannot be
// reached, and otherwise the settings found not in effect.
func (s *Store) CheckPath(ctx context.Context) (PathReport, error) {
	cfg := s.connConfig.Copy()
	// The check's own statements are unnamed: only the one it prepares
	// on purpose is left on a server connection.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	a, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return PathReport{}, s.c.classifyConnect("check path: connect", err)
	}
	defer a.Close(context.WithoutCancel(ctx))
	if s.connConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		b, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil {
			return PathReport{}, s.c.classifyConnect("check path: connect", err)
		}
		defer b.Close(context.WithoutCancel(ctx))
		if err := s.checkPrepared(ctx, a, b); err != nil {
			return PathReport{}, err
		}
	}
	var report PathReport
	report.Settings, err = s.checkSettings(ctx, a)
	return report, err
}

// checkPrepared prepares a named statement on a in one transaction and
// runs it in the next, while b holds a transaction open. Behind a pooler
// in transaction mode b's transaction gets the server connection a's
// just released (PgBouncer reuses the last released one first, its
// default), so a's statement runs on another server connection, where it
// does not exist (26000), as a command's would; or, with one server
// connection only, a's run waits for b, and b preparing the same name
// finds a's statement there (42P05). Directly on PostgreSQL, or behind a
// pooler that keeps prepared statements per client, both succeed.
func (s *Store) checkPrepared(ctx context.Context, a, b *pgx.Conn) error {
	var name string
	err := pgx.BeginFunc(ctx, a, func(tx pgx.Tx) error {
		// A name no other check used, on whichever server connection:
		// a statement left on a pooler's connection outlives a.
		if err := tx.QueryRow(ctx, `SELECT 'capledger_path_check_' || md5(random()::text || clock_timestamp()::text || pg_backend_pid())`).Scan(&name); err != nil {
			return err
		}
		_, err := tx.Prepare(ctx, name, `SELECT 1`)
		return err
	})
	if err != nil {
		return s.pathError("prepare", err)
	}
	bTx, err := b.Begin(ctx)
	if err != nil {
		return s.c.classify("check path: begin", err, false)
	}
	defer bTx.Rollback(context.WithoutCancel(ctx))
	if _, err := bTx.Exec(ctx, `SELECT pg_backend_pid()`); err != nil {
		return s.c.classify("check path: hold a transaction", err, false)
	}
	ran := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, name)
		ran <- err
	}()
	var runErr error
	received := false
	select {
	case runErr = <-ran:
		received = true
	case <-time.After(preparedWaitBeforeRelease):
	}
	_, prepErr := bTx.Prepare(ctx, name, `SELECT 1`)
	bTx.Rollback(context.WithoutCancel(ctx))
	if !received {
		runErr = <-ran
	}
	_ = a.Deallocate(context.WithoutCancel(ctx), name)
	if runErr != nil {
		return s.pathError("run a prepared statement in the next transaction", runErr)
	}
	if prepErr != nil {
		return s.pathError("prepare on another connection", prepErr)
	}
	return nil
}

// pathError reports err of the prepared statement check: wrapping
// ErrPreparedStatementsLost when the statement was lost or met another
// connection's, else classified.
func (s *Store) pathError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeInvalidStatementName || pgErr.Code == codeDuplicatePrepared) {
		return fmt.Errorf("%w (check path: %s: %v)", ErrPreparedStatementsLost, op, err)
	}
	return s.c.classify("check path: "+op, err, false)
}

// checkSettings returns the relied-on settings not in effect on conn as
// the store sets them. Values are compared as the server reads them
// (pg_settings.setting, in the setting's base unit: '5s' and 5000 are
// the same lock_timeout), the store's own normalised by setting it in a
// transaction rolled back.
func (s *Store) checkSettings(ctx context.Context, conn *pgx.Conn) ([]SettingNotInEffect, error) {
	var off []SettingNotInEffect
	for _, name := range sortedKeys(s.relied) {
		want := s.relied[name]
		var role, seen, seenBase, wantBase string
		err := func() error {
			// Rolled back: nothing of the check stays on the session.
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			err = tx.QueryRow(ctx, `SELECT current_user, current_setting($1), setting FROM pg_settings WHERE name = $1`, name).
				Scan(&role, &seen, &seenBase)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT set_config($1, $2, true)`, name, want); err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					return err
				}
				wantBase = want // not a value the server takes: compared as written
				return nil
			}
			return tx.QueryRow(ctx, `SELECT setting FROM pg_settings WHERE name = $1`, name).Scan(&wantBase)
		}()
		if err != nil {
			return nil, s.c.classify("check path: settings", err, false)
		}
		if !strings.EqualFold(seenBase, wantBase) {
			off = append(off, SettingNotInEffect{Name: name, Want: want, Seen: seen, Role: role})
		}
	}
	return off, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
