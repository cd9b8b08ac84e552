package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/store/postgres"
)

// Which primaries can lose an acknowledged commit on a crash or failover.
func TestReplicationRisk(t *testing.T) {
	safe := postgres.Replication{Fsync: true, SynchronousCommit: "on",
		SynchronousStandbyNames: "ANY 1 (a, b)", Standbys: 2, SyncStandbys: 2}
	for _, c := range []struct {
		name string
		edit func(*postgres.Replication)
		want string // "" = safe, else a phrase of the risk
	}{
		{"quorum of synchronous standbys", func(r *postgres.Replication) {}, ""},
		{"remote_apply", func(r *postgres.Replication) { r.SynchronousCommit = "remote_apply" }, ""},
		{"synchronous standby configured but none connected: COMMIT waits", func(r *postgres.Replication) { r.Standbys, r.SyncStandbys = 0, 0 }, ""},
		{"standalone", func(r *postgres.Replication) { r.SynchronousStandbyNames, r.Standbys, r.SyncStandbys = "", 0, 0 }, ""},
		{"standalone, synchronous_commit local", func(r *postgres.Replication) {
			r.SynchronousStandbyNames, r.Standbys, r.SyncStandbys, r.SynchronousCommit = "", 0, 0, "local"
		}, ""},
		{"standalone, synchronous_commit off", func(r *postgres.Replication) {
			r.SynchronousStandbyNames, r.Standbys, r.SyncStandbys, r.SynchronousCommit = "", 0, 0, "off"
		}, "synchronous_commit is off: a crash of the primary can lose acknowledged commits; set it to on or remote_apply"},
		{"fsync off", func(r *postgres.Replication) { r.Fsync = false }, "fsync is off: a crash of the primary can lose acknowledged commits; turn fsync on"},
		{"asynchronous standbys (pg_auto_failover wait_primary)", func(r *postgres.Replication) {
			r.SynchronousStandbyNames, r.SyncStandbys = "", 0
		}, "replicate asynchronously (synchronous_standby_names is empty): a failover to one of them can lose acknowledged commits; make them synchronous"},
		{"remote_write", func(r *postgres.Replication) { r.SynchronousCommit = "remote_write" }, "synchronous_commit is remote_write"},
		{"local with standbys", func(r *postgres.Replication) { r.SynchronousCommit = "local" }, "synchronous_commit is local"},
		{"off with standbys", func(r *postgres.Replication) { r.SynchronousCommit = "off" }, "synchronous_commit is off: a crash of the primary can lose acknowledged commits; set it to on"},
	} {
		r := safe
		c.edit(&r)
		got := r.Risk()
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s (%s): risk %q, want %q", c.name, r, got, c.want)
		}
	}
}

// The test server is standalone: Replication reads it as such, with no
// risk, and a session that turns synchronous_commit off is seen as at risk.
func TestReplicationOfTestServer(t *testing.T) {
	s, dsn := openStore(t)
	r, err := s.Replication(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Standbys != 0 || r.SynchronousStandbyNames != "" || r.Risk() != "" || !strings.HasPrefix(r.Server, "127.0.0.1:") {
		t.Fatalf("test server: %+v, risk %q", r, r.Risk())
	}
	off, err := postgres.Open(context.Background(), withParam(t, dsn, "synchronous_commit", "off"))
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	if r, err := off.Replication(context.Background()); err != nil || !strings.Contains(r.Risk(), "synchronous_commit is off") {
		t.Fatalf("synchronous_commit=off session: %+v, %v", r, err)
	}
}

// ALTER DATABASE ... SET synchronous_commit = off reaches only sessions
// that start after it, so the pool's open sessions still show on:
// Replication must read what the next session starts with, and /readyz
// say at risk, without a restart.
func TestReplicationSeesADatabaseSettingBeforeTheSessionsDo(t *testing.T) {
	dsn := serverDSN(t)
	var random [6]byte
	if _, err := rand.Read(random[:]); err != nil {
		t.Fatal(err)
	}
	db := "capledger_sc_" + hex.EncodeToString(random[:])
	replicatest.Admin(t, dsn, "CREATE DATABASE "+db)
	t.Cleanup(func() { replicatest.Admin(t, dsn, "DROP DATABASE "+db+" WITH (FORCE)") })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("%s is not a URL: %v", envDSN, err)
	}
	u.Path = "/" + db
	s, err := postgres.Open(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := s.Replication(context.Background()); err != nil || r.Risk() != "" {
		t.Fatalf("before: %+v, risk %q, %v", r, r.Risk(), err)
	}
	replicatest.Admin(t, dsn, "ALTER DATABASE "+db+" SET synchronous_commit = 'FALSE'")
	r, err := s.Replication(context.Background())
	if err != nil || !strings.Contains(r.Risk(), "synchronous_commit is off") {
		t.Fatalf("after ALTER DATABASE SET synchronous_commit off: %+v, risk %q, %v", r, r.Risk(), err)
	}
	// A DSN's own synchronous_commit wins over the database's.
	on, err := postgres.Open(context.Background(), withParam(t, u.String(), "synchronous_commit", "on"))
	if err != nil {
		t.Fatal(err)
	}
	defer on.Close()
	if r, err := on.Replication(context.Background()); err != nil || r.Risk() != "" {
		t.Fatalf("DSN synchronous_commit=on over the database's off: %+v, risk %q, %v", r, r.Risk(), err)
	}
}

// A login without pg_read_all_stats reads every standby's sync_state as
// NULL: the description must not report a healthy quorum as "0
// synchronous" without saying that it cannot see (found following
// OPERATIONS.md's pg_auto_failover steps with a capledger role that is
// not superuser: "2 standby(s) streaming, 0 synchronous").
func TestReplicationStringSaysWhenSyncStateIsHidden(t *testing.T) {
	r := postgres.Replication{Server: "10.0.0.7:5432", Fsync: true, SynchronousCommit: "on",
		SynchronousStandbyNames: "ANY 1 (a, b)", Standbys: 2, SyncStandbys: 0, HiddenStandbys: 2}
	got := r.String()
	if !strings.Contains(got, "sync state of 2 not visible to this login") || !strings.Contains(got, "pg_monitor") {
		t.Errorf("hidden sync state: %q, want it to say the sync state of 2 is not visible and to grant pg_monitor", got)
	}
	r.SyncStandbys, r.HiddenStandbys = 2, 0
	if got := r.String(); strings.Contains(got, "not visible") || !strings.HasSuffix(got, "2 standby(s) streaming, 2 synchronous") {
		t.Errorf("visible sync state: %q", got)
	}
}
