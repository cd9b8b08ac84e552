package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/capledger/capledger/store"
)

// SQLSTATE codes the driver acts on.
const (
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeLockNotAvailable     = "55P03" // lock_timeout, or NOWAIT refused
	codeQueryCanceled        = "57014" // statement_timeout
	codeUniqueViolation      = "23505"
	codeCheckViolation       = "23514"
	codeAdminShutdown        = "57P01"
	codeCrashShutdown        = "57P02"
	codeCannotConnectNow     = "57P03"
	codeTooManyConnections   = "53300"
	codeReadOnlyTransaction  = "25006" // a standby after failover, still read-only
	codeProtocolViolation    = "08P01" // also PgBouncer's refusals, most of them passing
	codeDataCorrupted        = "XX001" // a page that fails its checks (invalid page header, checksum)
	codeIndexCorrupted       = "XX002"
)

// ErrStartupParameterRefused: the server (PgBouncer) refused a startup
// parameter of a connection the store opens, one the DSN names or the
// store sends (lock_timeout, idle_in_transaction_session_timeout,
// plan_cache_mode; default_transaction_read_only for OpenReadOnly). A
// configuration error no retry changes: Open, OpenReadOnly and Migrate
// return it, not store.ErrUnavailable.
var ErrStartupParameterRefused = errors.New("the server refused a startup parameter: list it in PgBouncer's ignore_startup_parameters (and set the store's own on the role, docs/OPERATIONS.md \"PgBouncer\"), or leave it out of the DSN")

// counters are the driver's cumulative event counts (see Stats).
type counters struct {
	transactions, commits, rollbacks       atomic.Uint64
	conflicts, deadlocks, serialization    atomic.Uint64
	lockNotAvailable                       atomic.Uint64
	duplicates, unavailable, commitUnknown atomic.Uint64
	checkViolations                        atomic.Uint64
	// onLost, if set, is told of every error reported as ErrUnavailable.
	onLost func(error)
}

// classify is the one place that turns driver errors into the store's
// terms. op names what was being done ("commit", "account get t/r@eu#3").
// It returns nil for nil, and otherwise an error wrapping:
//   - store.ErrConflict for serialization failures (40001), deadlocks
//     (40P01), lock timeouts and NOWAIT locks refused because another
//     transaction holds the row (55P03), and statement timeouts (57014):
//     the server rolled the transaction back and rerunning it whole is safe;
//   - store.ErrDuplicate for unique violations (23505);
//   - store.ErrUnavailable for everything that means the server could not
//     be reached or the outcome is unknown: connection failures, a server
//     shutting down or terminating the backend (57P0x, class 08), too many
//     connections, a read-only standby, context cancellation, and any
//     non-server error during COMMIT (the commit may or may not have
//     happened, so it must never be reported as success or as a clean
//     conflict);
//   - store.ErrDamaged for the server's own corruption errors (XX001
//     data_corrupted, XX002 index_corrupted), so a command (capledger
//     audit, migrate, backup) knows no retry repairs it; otherwise wrapped
//     as before (at COMMIT store.ErrUnavailable beside it, elsewhere
//     nothing more), so a server answers them as it did;
//   - the error itself, with context, for anything else (a bug: a CHECK
//     constraint refusing a negative term, a malformed query).
func (c *counters) classify(op string, err error, commit bool) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == codeSerializationFailure:
			c.conflicts.Add(1)
			c.serialization.Add(1)
			return fmt.Errorf("%s: %w: %w", op, store.ErrConflict, err)
		case pgErr.Code == codeDeadlockDetected:
			c.conflicts.Add(1)
			c.deadlocks.Add(1)
			return fmt.Errorf("%s: %w: %w", op, store.ErrConflict, err)
		case pgErr.Code == codeLockNotAvailable:
			c.conflicts.Add(1)
			c.lockNotAvailable.Add(1)
			return fmt.Errorf("%s: %w: %w", op, store.ErrConflict, err)
		case pgErr.Code == codeQueryCanceled && !commit:
			c.conflicts.Add(1)
			c.lockNotAvailable.Add(1)
			return fmt.Errorf("%s: %w: %w", op, store.ErrConflict, err)
		case pgErr.Code == codeUniqueViolation:
			c.duplicates.Add(1)
			return fmt.Errorf("%s: %w: %w", op, store.ErrDuplicate, err)
		case pgErr.Code == codeCheckViolation:
			c.checkViolations.Add(1)
			return fmt.Errorf("%s: database refused a broken invariant (%s): %w", op, pgErr.ConstraintName, err)
		case pgErr.Code == codeDataCorrupted, pgErr.Code == codeIndexCorrupted:
			if commit {
				return fmt.Errorf("%w: %w", store.ErrDamaged, c.lost(op, err, commit))
			}
			return fmt.Errorf("%s: %w: %w", op, store.ErrDamaged, err)
		case strings.HasPrefix(pgErr.Code, "08"), pgErr.Code == codeAdminShutdown, pgErr.Code == codeCrashShutdown,
			pgErr.Code == codeCannotConnectNow, pgErr.Code == codeTooManyConnections, pgErr.Code == codeReadOnlyTransaction:
			return c.lost(op, err, commit)
		case commit:
			// Any other answer to COMMIT: report the conservative
			// "outcome unknown"; a retry with the same ids converges.
			return c.lost(op, err, commit)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		// COMMIT answered ROLLBACK: the server discarded the transaction
		// after an earlier error, so nothing was applied.
		c.conflicts.Add(1)
		return fmt.Errorf("%s: %w: %w", op, store.ErrConflict, err)
	}
	// Everything else is not an answer from the server about this
	// transaction: a broken or closed connection, a timeout, a cancelled
	// context, a pool that could not connect. During COMMIT it is the
	// unknown outcome the store contract calls ErrUnavailable.
	var netErr net.Error
	if commit || errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		pgconn.Timeout(err) || isConnectError(err) || errors.Is(err, net.ErrClosed) || errors.Is(err, pgx.ErrTxClosed) ||
		strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "conn busy") {
		return c.lost(op, err, commit)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// classifyConnect is classify for opening a connection (Open, CheckPath,
// OpenReadOnly, Migrate): PgBouncer's refusal of a startup parameter
// (SQLSTATE 08P01 like its passing refusals, told apart by its message
// "unsupported startup parameter: NAME") wraps ErrStartupParameterRefused,
// not store.ErrUnavailable; everything else is classify's.
func (c *counters) classifyConnect(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeProtocolViolation && strings.HasPrefix(pgErr.Message, "unsupported startup parameter") {
		return fmt.Errorf("%s: %w: %w", op, ErrStartupParameterRefused, err)
	}
	return c.classify(op, err, false)
}

func (c *counters) lost(op string, err error, commit bool) error {
	c.unavailable.Add(1)
	if c.onLost != nil {
		c.onLost(err)
	}
	if commit {
		c.commitUnknown.Add(1)
		return fmt.Errorf("%s: outcome unknown: %w: %w", op, store.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w: %w", op, store.ErrUnavailable, err)
}

func isConnectError(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr)
}
