package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// The ledger writes on every command, so it connects only to a server that
// accepts writes. A DSN that asks for anything else, "any" included, is
// refused at Open with the reason, instead of the setting being quietly
// replaced (any) or the store landing on a standby and failing every
// command (read-only, standby, prefer-standby). Left out or read-write, it
// opens.
func TestTargetSessionAttrsMustAcceptWrites(t *testing.T) {
	ctx := context.Background()
	dsn := schemaDSN(t)
	t.Setenv("PGTARGETSESSIONATTRS", "")
	for _, value := range []string{"any", "read-only", "standby", "prefer-standby", "primary"} {
		s, err := postgres.Open(ctx, withParam(t, dsn, "target_session_attrs", value))
		if err == nil {
			s.Close()
			t.Errorf("target_session_attrs=%s: opened", value)
			continue
		}
		if errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "target_session_attrs="+value) ||
			!strings.Contains(err.Error(), "read-write") {
			t.Errorf("target_session_attrs=%s: %v, want a refusal naming it and read-write", value, err)
		}
	}
	// The key=value form too.
	if _, err := postgres.Open(ctx, "host=127.0.0.1 target_session_attrs=any"); err == nil ||
		!strings.Contains(err.Error(), "target_session_attrs=any") {
		t.Errorf("key=value DSN with target_session_attrs=any: %v, want a refusal", err)
	}
	for _, with := range []string{"", "read-write"} {
		d := dsn
		if with != "" {
			d = withParam(t, dsn, "target_session_attrs", with)
		}
		s, err := postgres.Open(ctx, d)
		if err != nil {
			t.Fatalf("target_session_attrs %q: %v", with, err)
		}
		s.Close()
	}
	// The environment counts as the DSN does (the DSN's own setting wins).
	t.Setenv("PGTARGETSESSIONATTRS", "any")
	if _, err := postgres.Open(ctx, dsn); err == nil || !strings.Contains(err.Error(), "target_session_attrs=any") {
		t.Errorf("PGTARGETSESSIONATTRS=any: %v, want a refusal", err)
	}
	s, err := postgres.Open(ctx, withParam(t, dsn, "target_session_attrs", "read-write"))
	if err != nil {
		t.Fatalf("PGTARGETSESSIONATTRS=any under a DSN's read-write: %v", err)
	}
	s.Close()
}

// A DSN that does not parse is refused saying what is wrong, without the
// DSN (it may hold a password). For the parse errors pgconn raises without
// a wrapped cause (a port that is no number, an unknown
// target_session_attrs) the message was "postgres dsn: %!w(<nil>)": nothing
// an operator could act on. Needs no database: the DSN never gets that far.
func TestMalformedDSNSaysWhatIsWrongWithoutThePassword(t *testing.T) {
	ctx := context.Background()
	t.Setenv("PGTARGETSESSIONATTRS", "")
	for dsn, want := range map[string]string{
		"postgres://capledger:s3cr3t-pw@127.0.0.1:abc/capledger":                          "port",
		"postgres://capledger:s3cr3t-pw@127.0.0.1:5432/capledger?target_session_attrs=rw": "target_session_attrs",
		"postgres://capledger:s3cr3t-pw@127.0.0.1:5432/capledger?sslmode=bogus":           "sslmode",
		"postgres://capledger:s3cr3t-pw@127.0.0.1:5432/capledger?pool_max_conns=many":     "pool_max_conns",
		"host=127.0.0.1 password=s3cr3t-pw target_session_attrs=rw":                       "target_session_attrs",
	} {
		s, err := postgres.Open(ctx, dsn)
		if err == nil {
			s.Close()
			t.Errorf("%s: opened", dsn)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, want) || strings.Contains(msg, "%!") || strings.Contains(msg, "s3cr3t-pw") || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s: %q, want a refusal naming %s, without the password", dsn, msg, want)
		}
	}
}
