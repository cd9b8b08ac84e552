package replicatest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
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

// FreeAddr closes the port it found free: another process may bind it
// before the replica does. A server there answers /readyz as a replica
// would; StartReplica must not take it for its replica (whose serve then
// fails to listen), and must start the replica on another address.
func TestReplicaAddressTakenMeanwhile(t *testing.T) {
	bin := BuildCapledger(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	foreign := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/statusz" {
			w.Write([]byte(`{"ready":true,"workers":{"self":"elsewhere-1-00000000"}}`))
		}
	}))
	foreign.Listener = ln
	foreign.Start()
	defer foreign.Close()
	taken := ln.Addr().String()

	handed := 0
	freeAddr = func(t testing.TB) string {
		if handed++; handed == 1 {
			return taken
		}
		return FreeAddr(t)
	}
	defer func() { freeAddr = FreeAddr }()
	r := StartReplica(t, bin, "sqlite:"+filepath.Join(t.TempDir(), "ledger.db"))
	if r.Addr == taken || handed != 2 {
		t.Fatalf("the replica serves at %s after %d addresses; %s was taken", r.Addr, handed, taken)
	}
	if err := r.answers(fmt.Sprintf("-%d-", r.cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	r.Addr = taken // a restart on an address taken meanwhile fails, saying so
	if err := r.start(); !errors.Is(err, errAddrTaken) {
		t.Fatalf("a restart on a taken address: %v, want %v", err, errAddrTaken)
	}
}
