package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/capledger/capledger/store"
)

// Every driver error maps to exactly one of the store's terms (or to none,
// for bugs), and COMMIT never reports an unknown outcome as anything but
// store.ErrUnavailable.
func TestClassify(t *testing.T) {
	pg := func(code, severity string) error {
		return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Severity: severity, Message: "m"})
	}
	none := error(nil)
	cases := []struct {
		name   string
		err    error
		commit bool
		want   error
	}{
		{"serialization failure", pg("40001", "ERROR"), false, store.ErrConflict},
		{"deadlock", pg("40P01", "ERROR"), false, store.ErrConflict},
		{"lock timeout / NOWAIT", pg("55P03", "ERROR"), false, store.ErrConflict},
		{"statement timeout", pg("57014", "ERROR"), false, store.ErrConflict},
		{"serialization failure at commit", pg("40001", "ERROR"), true, store.ErrConflict},
		{"unique violation", pg("23505", "ERROR"), false, store.ErrDuplicate},
		{"unique violation at commit (deferred)", pg("23505", "ERROR"), true, store.ErrDuplicate},
		{"check violation", pg("23514", "ERROR"), false, none},
		{"syntax error", pg("42601", "ERROR"), false, none},
		{"backend terminated", pg("57P01", "FATAL"), false, store.ErrUnavailable},
		{"backend terminated at commit", pg("57P01", "FATAL"), true, store.ErrUnavailable},
		{"connection failure", pg("08006", "FATAL"), false, store.ErrUnavailable},
		{"too many connections", pg("53300", "FATAL"), false, store.ErrUnavailable},
		{"read-only standby", pg("25006", "ERROR"), false, store.ErrUnavailable},
		{"statement timeout at commit", pg("57014", "ERROR"), true, store.ErrUnavailable},
		{"other error at commit", pg("XX000", "ERROR"), true, store.ErrUnavailable},
		{"EOF", io.ErrUnexpectedEOF, false, store.ErrUnavailable},
		{"EOF at commit", io.ErrUnexpectedEOF, true, store.ErrUnavailable},
		{"cancelled context", context.Canceled, false, store.ErrUnavailable},
		{"deadline at commit", context.DeadlineExceeded, true, store.ErrUnavailable},
		{"commit answered ROLLBACK", pgx.ErrTxCommitRollback, true, store.ErrConflict},
		{"scan type mismatch", errors.New("can't scan into dest[0]"), false, none},
	}
	sentinels := []error{store.ErrConflict, store.ErrDuplicate, store.ErrUnavailable, store.ErrNotFound, store.ErrDamaged}
	for _, tc := range cases {
		var c counters
		got := c.classify("op", tc.err, tc.commit)
		if got == nil || !errors.Is(got, tc.err) {
			t.Errorf("%s: %v does not wrap the driver error", tc.name, got)
		}
		for _, s := range sentinels {
			if errors.Is(got, s) != (s == tc.want) {
				t.Errorf("%s: classified %v; want sentinel %v", tc.name, got, tc.want)
			}
		}
		if tc.want == store.ErrConflict && c.conflicts.Load() != 1 {
			t.Errorf("%s: conflicts counter %d, want 1", tc.name, c.conflicts.Load())
		}
		if tc.commit && tc.want == store.ErrUnavailable && c.commitUnknown.Load() != 1 {
			t.Errorf("%s: commit-unknown counter %d, want 1", tc.name, c.commitUnknown.Load())
		}
	}
	var c counters
	if c.classify("op", nil, true) != nil {
		t.Error("nil error classified as an error")
	}
}

// The server's own corruption errors (XX001 data_corrupted, XX002
// index_corrupted) are store.ErrDamaged, which no retry repairs (capledger
// audit, migrate and backup exit 1, not the retryable 5), wrapped
// otherwise as before, so a server answers them as it did: at COMMIT
// store.ErrUnavailable beside it (the outcome is unknown), elsewhere
// nothing more.
func TestClassifyCorruptionIsDamaged(t *testing.T) {
	for _, code := range []string{"XX001", "XX002"} {
		for _, commit := range []bool{false, true} {
			driverErr := &pgconn.PgError{Code: code, Severity: "ERROR", Message: "invalid page in block 7 of relation base/16384/16401"}
			var c counters
			got := c.classify("account get t/r@global#1", fmt.Errorf("wrapped: %w", driverErr), commit)
			if !errors.Is(got, store.ErrDamaged) || !errors.Is(got, driverErr) {
				t.Errorf("%s (commit %v): classified %v, want store.ErrDamaged wrapping the driver error", code, commit, got)
			}
			if errors.Is(got, store.ErrUnavailable) != commit {
				t.Errorf("%s (commit %v): classified %v: store.ErrUnavailable %v, want %v (as before)", code, commit, got, !commit, commit)
			}
			if errors.Is(got, store.ErrConflict) || errors.Is(got, store.ErrDuplicate) {
				t.Errorf("%s (commit %v): classified %v as a conflict or duplicate", code, commit, got)
			}
			if commit && c.commitUnknown.Load() != 1 {
				t.Errorf("%s at commit: commit-unknown counter %d, want 1", code, c.commitUnknown.Load())
			}
		}
	}
	// Another internal error (XX000) is not damage: a bug, or at COMMIT
	// an unknown outcome.
	var c counters
	if got := c.classify("op", &pgconn.PgError{Code: "XX000", Severity: "ERROR"}, false); errors.Is(got, store.ErrDamaged) {
		t.Errorf("XX000 classified as damaged: %v", got)
	}
}
