package replicatest

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A replica is seen to have exited however it ended: stopped, killed, or
// on its own (here a SIGTERM sent behind the harness's back, as a crash
// would end it); and it restarts on the same address. It runs on the
// embedded store, so it needs no PostgreSQL.
func TestReplicaExited(t *testing.T) {
	bin := BuildCapledger(t)
	r := StartReplica(t, bin, "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
	if r.Exited() {
		t.Fatal("a ready replica reported as exited")
	}
	r.Kill()
	if !r.Exited() {
		t.Fatal("a killed replica not reported as exited")
	}
	r.Start()
	if err := r.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !r.Exited() {
		if time.Now().After(deadline) {
			t.Fatalf("a replica that exited on its own still reported running after 15 s:\n%s", r.Logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
