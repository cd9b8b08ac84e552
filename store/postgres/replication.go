package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Replication is what the server the store writes to promises about an
// acknowledged commit: the settings and standbys that decide whether a
// commit the ledger has answered "ok" for survives a crash of that server
// and a failover to one of its standbys.
type Replication struct {
	// Server is host:port of the primary the pool reached.
	Server string
	// SynchronousCommit and SynchronousStandbyNames are the primary's
	// settings as the ledger's sessions see them; Fsync is fsync.
	// SynchronousCommit is the weaker of the session's value and the one
	// a database or role setting gives the pool's next sessions (ALTER
	// DATABASE ... SET is read only at a session's start: a pooled
	// session keeps the value it started with).
	SynchronousCommit, SynchronousStandbyNames string
	Fsync                                      bool
	// Standbys counts the standbys streaming from the primary now
	// (pg_stat_replication); SyncStandbys those of them acknowledging
	// commits (sync_state sync or quorum). HiddenStandbys counts those
	// whose sync_state the login may not read: PostgreSQL shows a role
	// that is neither superuser nor a member of pg_read_all_stats (or
	// pg_monitor) every standby's row with sync_state NULL, so
	// SyncStandbys alone would say 0 synchronous on a healthy quorum.
	Standbys, SyncStandbys, HiddenStandbys int
}

// Risk returns "" when every commit this primary acknowledges is flushed
// to its own disk and, if it has standbys, to a synchronous standby's WAL
// before COMMIT returns, so neither a crash nor a failover to the standby
// that the failover manager promotes can lose it. Otherwise it says why an
// acknowledged commit could be lost, then what setting repairs that (serve
// refuses with it: the operator needs the fix, not only the risk).
//
// The rule, per case:
//   - fsync off or synchronous_commit off: a crash of the primary alone
//     can lose acknowledged commits, standbys or not;
//   - no standby streaming and synchronous_standby_names empty: a
//     standalone server. Nothing can be failed over to, and what it
//     acknowledged is on its disk: no risk. (A standby that is configured
//     but disconnected and asynchronous is invisible from here; the
//     operator's failover manager must not promote it.)
//   - standbys streaming but synchronous_standby_names empty: every one of
//     them is asynchronous, and a failover to any loses the commits it had
//     not received yet (pg_auto_failover's wait_primary state is this,
//     for the seconds a standby takes to catch up);
//   - synchronous_standby_names set but synchronous_commit local or
//     remote_write: COMMIT returns before a standby has the commit on
//     disk (local: not even received).
//
// synchronous_commit on or remote_apply with synchronous_standby_names set
// is safe even while no synchronous standby is connected: COMMIT then
// waits (the ledger stalls, answers 503 after its batch timeout with
// outcome unknown) rather than acknowledging.
func (r Replication) Risk() string {
	switch {
	case !r.Fsync:
		return "fsync is off: a crash of the primary can lose acknowledged commits; turn fsync on"
	case r.SynchronousCommit == "off":
		return "synchronous_commit is off: a crash of the primary can lose acknowledged commits; set it to on or remote_apply"
	case r.SynchronousStandbyNames == "" && r.Standbys == 0:
		return ""
	case r.SynchronousStandbyNames == "":
		return fmt.Sprintf("%d standby(s) replicate asynchronously (synchronous_standby_names is empty): "+
			"a failover to one of them can lose acknowledged commits; make them synchronous (synchronous_standby_names)", r.Standbys)
	case r.SynchronousCommit == "local" || r.SynchronousCommit == "remote_write":
		return fmt.Sprintf("synchronous_commit is %s: COMMIT returns before a synchronous standby has flushed it, "+
			"so a failover can lose acknowledged commits; set it to on or remote_apply", r.SynchronousCommit)
	}
	return ""
}

// String describes the replication for logs and readiness.
func (r Replication) String() string {
	if r.SynchronousStandbyNames == "" && r.Standbys == 0 {
		return fmt.Sprintf("primary %s: standalone (no standbys), synchronous_commit=%s", r.Server, r.SynchronousCommit)
	}
	sync := fmt.Sprintf("%d synchronous", r.SyncStandbys)
	if r.HiddenStandbys > 0 {
		sync = fmt.Sprintf("%d synchronous, sync state of %d not visible to this login (GRANT pg_monitor TO it)",
			r.SyncStandbys, r.HiddenStandbys)
	}
	return fmt.Sprintf("primary %s: synchronous_commit=%s synchronous_standby_names=%q, %d standby(s) streaming, %s",
		r.Server, r.SynchronousCommit, r.SynchronousStandbyNames, r.Standbys, sync)
}

// Replication reads the primary's replication settings and standbys
// through the pool (so through the DSN's read-write host selection).
// It returns an error wrapping store.ErrUnavailable when no primary can be
// reached; the error names every host the DSN lists.
func (s *Store) Replication(ctx context.Context) (Replication, error) {
	var r Replication
	var fsync, source, stored string
	err := s.pool.QueryRow(ctx, `SELECT coalesce(inet_server_addr()::text, 'local') || ':' || current_setting('port'),
			current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), current_setting('fsync'),
			(SELECT count(*) FROM pg_stat_replication),
			(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
			(SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL),
			(SELECT source FROM pg_settings WHERE name = 'synchronous_commit'),
			`+storedSynchronousCommit).
		Scan(&r.Server, &r.SynchronousCommit, &r.SynchronousStandbyNames, &fsync, &r.Standbys, &r.SyncStandbys, &r.HiddenStandbys, &source, &stored)
	if err != nil {
		return Replication{}, s.c.classify("replication: no read-write primary reachable among "+s.hosts(), err, false)
	}
	r.Server = strings.TrimSuffix(strings.Replace(r.Server, "/32", "", 1), "/128")
	r.Fsync = fsync == "on"
	// A value the DSN sets (source client) overrides database and role
	// settings in every session the pool opens; otherwise the stored one,
	// if any, is what the next session starts with.
	if source != "client" && stored != "" && commitRank(stored) < commitRank(r.SynchronousCommit) {
		r.SynchronousCommit = normalCommit(stored)
	}
	return r, nil
}

// storedSynchronousCommit selects the synchronous_commit a database or
// role setting (ALTER DATABASE / ALTER ROLE ... SET) gives a new session
// of this login in this database, empty when none does: per PostgreSQL's
// precedence, role-and-database over role over database.
const storedSynchronousCommit = `coalesce((SELECT substr(c, length('synchronous_commit=') + 1)
			FROM pg_db_role_setting r, unnest(r.setconfig) AS c
			WHERE c LIKE 'synchronous_commit=%'
			AND r.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
			AND r.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user))
			ORDER BY r.setrole <> 0 DESC, r.setdatabase <> 0 DESC LIMIT 1), '')`

// normalCommit spells a synchronous_commit value as SHOW does: a stored
// setting keeps the spelling it was set with ('false', 'OFF', '0').
func normalCommit(v string) string {
	switch v = strings.ToLower(strings.Trim(v, `'" `)); v {
	case "false", "no", "0":
		return "off"
	case "true", "yes", "1":
		return "on"
	}
	return v
}

// commitRank orders synchronous_commit values by what a COMMIT waits for.
func commitRank(v string) int {
	switch normalCommit(v) {
	case "off":
		return 0
	case "local":
		return 1
	case "remote_write":
		return 2
	case "on":
		return 3
	}
	return 4 // remote_apply
}

// hosts lists the host:port pairs the DSN names, for messages.
func (s *Store) hosts() string {
	cfg := s.pool.Config().ConnConfig
	list := []string{fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)}
	for _, fb := range cfg.Fallbacks {
		list = append(list, fmt.Sprintf("%s:%d", fb.Host, fb.Port))
	}
	return strings.Join(list, ", ")
}

// resetOnLostServer empties the pool after an error classified as
// ErrUnavailable (the server went away: a failover, a restart, a cut
// connection): every idle connection likely points at the same dead or
// demoted server, and without the reset each would fail one more batch in
// turn before the pool dialed the new primary. Connections in use are
// closed when they are returned. A cancelled or timed-out context says
// nothing about the server and resets nothing.
func (s *Store) resetOnLostServer(err error) {
	if s.pool == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	s.pool.Reset()
}
