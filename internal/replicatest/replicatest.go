// Package replicatest runs `capledger serve` replicas on a fresh
// PostgreSQL schema for the tests of store/postgres, its failover gate and
// the SDK (client's external tests), and checks what their clients saw
// against a linearizability model of one account (model.go); its smaller
// pieces (a free loopback address, a statement run as the PostgreSQL
// admin) serve other packages' tests too. It is test support: only test
// files import it.
package replicatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/logcapture"
	"github.com/capledger/capledger/internal/testport"
)

// BuildCapledger builds the capledger binary into a temporary directory
// and returns its path.
func BuildCapledger(t testing.TB) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "capledger")
	cmd := exec.Command(goTool, "build", "-o", bin, "github.com/capledger/capledger/cmd/capledger")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build capledger: %v\n%s", err, out)
	}
	return bin
}

// FreeAddr returns a loopback address nothing listens on now, on a port
// below the ephemeral range (testport.Addr): no outgoing connection takes
// it between this check and the server binding it.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return testport.Addr(t)
}

// Replica is one `capledger serve --store postgres://...` process.
type Replica struct {
	// Addr is where it serves (the same across restarts).
	Addr string
	// Logs is its output; the child writes it while a failure message
	// reads it.
	Logs logcapture.Logs

	t   testing.TB
	bin string
	dsn string
	// extra are serve flags after the store's.
	extra []string
	// dataDir is where the process writes the files it keeps besides the
	// store (its shard keys): a temporary directory, not the package's.
	dataDir string

	mu  sync.Mutex
	cmd *exec.Cmd
	// exited is closed once the running process has exited, however it
	// ended (its Wait returned).
	exited chan struct{}
}

// StartReplica starts a replica of the store at dsn with the extra serve
// flags, waits until it is ready and stops it when the test ends.
//
// Its address is found free by FreeAddr, which closes the port again:
// another process on the machine may bind it before the replica does.
// The first start then picks another address, up to three times (a
// restart keeps its address: the clients know it).
func StartReplica(t testing.TB, bin, dsn string, extra ...string) *Replica {
	t.Helper()
	r := &Replica{t: t, bin: bin, dsn: dsn, extra: extra, dataDir: t.TempDir()}
	t.Cleanup(r.Stop)
	for attempt := 1; ; attempt++ {
		r.Addr = freeAddr(t)
		err := r.start()
		if err == nil {
			return r
		}
		if !errors.Is(err, errAddrTaken) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("replica: %v; another address", err)
	}
}

// freeAddr is FreeAddr; a test of StartReplica replaces it.
var freeAddr = FreeAddr

// errAddrTaken: the replica could not listen on its address, which
// another process took after FreeAddr found it free.
var errAddrTaken = errors.New("its address was taken by another process")

// Start runs the process and waits until it answers /readyz.
func (r *Replica) Start() {
	r.t.Helper()
	if err := r.start(); err != nil {
		r.t.Fatal(err)
	}
}

// start runs the process and waits until it answers /readyz, and
// /statusz names it (by its pid) as the replica answering: a process
// that took the address first may answer too.
func (r *Replica) start() error {
	r.mu.Lock()
	args := append([]string{"serve", "--addr", r.Addr, "--store", r.dsn, "--data-dir", r.dataDir, "--log-level", "warn"}, r.extra...)
	cmd := exec.Command(r.bin, args...)
	childproc.DieWithParent(cmd)
	cmd.Stdout, cmd.Stderr = &r.Logs, &r.Logs
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("start replica: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	r.cmd, r.exited = cmd, exited
	r.mu.Unlock()
	self := fmt.Sprintf("-%d-", cmd.Process.Pid)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := r.answers(self)
		if err == nil {
			return nil
		}
		if r.Exited() {
			logs := r.Logs.String()
			if strings.Contains(logs, "address already in use") {
				return fmt.Errorf("replica %s: %w:\n%s", r.Addr, errAddrTaken, logs)
			}
			return fmt.Errorf("replica %s exited before it was ready:\n%s", r.Addr, logs)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica %s not ready after 30s: %v\n%s", r.Addr, err, r.Logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// answers reports (as nil) whether the server at the replica's address
// is ready and is the process whose holder name contains self.
func (r *Replica) answers(self string) error {
	resp, err := http.Get("http://" + r.Addr + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	resp, err = http.Get("http://" + r.Addr + "/statusz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var st struct {
		Workers struct {
			Self string `json:"self"`
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return fmt.Errorf("/statusz: %s, %w", resp.Status, err)
	}
	if !strings.Contains(st.Workers.Self, self) {
		return fmt.Errorf("another process answers at the address: /statusz names %q, not pid %s", st.Workers.Self, strings.Trim(self, "-"))
	}
	return nil
}

// Kill ends the process with SIGKILL: no graceful shutdown, batches in
// flight are cut off mid-transaction.
func (r *Replica) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.cmd.Process.Signal(syscall.SIGKILL)
		<-r.exited
		r.cmd = nil
	}
}

// Stop ends the process with SIGTERM (a graceful shutdown), and with
// SIGKILL if it has not exited after 10 s.
func (r *Replica) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-r.exited
		}
		r.cmd = nil
	}
}

// Signal sends sig to the running process (SIGSTOP and SIGCONT freeze
// and thaw it: a long GC or VM pause); it fails if none runs.
func (r *Replica) Signal(sig os.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return errors.New("replica not running")
	}
	return r.cmd.Process.Signal(sig)
}

// Exited reports whether the process is not running: never started,
// stopped or killed, or exited on its own.
func (r *Replica) Exited() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return true
	}
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

// Refused reports whether err is a definite refusal by the ledger (as
// opposed to a lost answer or an unavailable server).
func Refused(err error) bool {
	for _, sentinel := range []error{client.ErrNotFound, client.ErrDigestMismatch, client.ErrNotStarted,
		client.ErrAlreadyStarted, client.ErrAlreadySettled, client.ErrReleased, client.ErrExpired,
		client.ErrOperationMismatch, client.ErrNoPolicy} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// Admin runs sql on the server at dsn on a connection of its own (schema
// and role changes, faults planted behind the store's back), failing the
// test if it fails.
func Admin(t testing.TB, dsn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// EnvDSN names the variable holding the test PostgreSQL server's DSN; CI
// sets it to postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
const EnvDSN = "CAPLEDGER_TEST_POSTGRES"

// ServerDSN returns the test server's DSN. Without the variable the test
// is skipped (saying how to set it); with it, an unreachable server fails
// the test, so CI can never pass by silently skipping.
func ServerDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		t.Skipf("PostgreSQL tests need a server: set %s, e.g. %s=postgres://postgres@127.0.0.1:5432/test?sslmode=disable", EnvDSN, EnvDSN)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("%s is set but the server cannot be reached: %v", EnvDSN, err)
	}
	conn.Close(ctx)
	return dsn
}

// SchemaDSN creates a fresh schema capledger_test_<random> on the test
// server (ServerDSN), drops it when the test ends, and returns a DSN whose
// search_path selects it, so parallel test packages and runs never share
// tables.
func SchemaDSN(t testing.TB) string {
	t.Helper()
	dsn := ServerDSN(t)
	var random [6]byte
	if _, err := rand.Read(random[:]); err != nil {
		t.Fatal(err)
	}
	schema := "capledger_test_" + hex.EncodeToString(random[:])
	Admin(t, dsn, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { Admin(t, dsn, "DROP SCHEMA "+schema+" CASCADE") })
	return WithParam(t, dsn, "search_path", schema)
}

// WithParam returns dsn with a connection parameter added (URL or
// key=value form).
func WithParam(t testing.TB, dsn, name, value string) string {
	t.Helper()
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("parse %s: %v", EnvDSN, err)
		}
		q := u.Query()
		q.Set(name, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + name + "=" + value
}
