package failovergate

// Helpers shared with store/postgres's own tests (replicas_test.go,
// model_test.go), copied because test files cannot be imported: the
// binary builder, the serve process, the refusal classifier and the
// porcupine model of one no-refill account.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/logcapture"
)

// buildCapledger builds the capledger binary into a temporary directory
// and returns its path.
func buildCapledger(t testing.TB) string {
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

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// replica is one `capledger serve --store postgres://...` process.
type replica struct {
	t     testing.TB
	bin   string
	dsn   string
	addr  string
	extra []string
	// dataDir is where the process writes the files it keeps besides the
	// store (its shard keys): a temporary directory, not the package's.
	dataDir string

	mu   sync.Mutex
	cmd  *exec.Cmd
	logs logcapture.Logs // the child writes it while a failure message reads it
}

func startReplica(t testing.TB, bin, dsn string, extra ...string) *replica {
	t.Helper()
	r := &replica{t: t, bin: bin, dsn: dsn, addr: freeAddr(t), extra: extra, dataDir: t.TempDir()}
	r.start()
	t.Cleanup(r.stop)
	return r
}

// start runs the process and waits until it answers /readyz.
func (r *replica) start() {
	r.t.Helper()
	r.mu.Lock()
	args := append([]string{"serve", "--addr", r.addr, "--store", r.dsn, "--data-dir", r.dataDir, "--log-level", "warn"}, r.extra...)
	cmd := exec.Command(r.bin, args...)
	childproc.DieWithParent(cmd)
	cmd.Stdout, cmd.Stderr = &r.logs, &r.logs
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		r.t.Fatalf("start replica: %v", err)
	}
	r.cmd = cmd
	r.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + r.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.t.Fatalf("replica %s not ready after 30s: %v\n%s", r.addr, err, r.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill ends the process with SIGKILL: no graceful shutdown, batches in
// flight are cut off mid-transaction.
func (r *replica) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.cmd.Process.Signal(syscall.SIGKILL)
		r.cmd.Wait()
		r.cmd = nil
	}
}

func (r *replica) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { r.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-done
		}
		r.cmd = nil
	}
}

// refused reports whether err is a definite refusal by the ledger (as
// opposed to a lost answer or an unavailable server).
func refused(err error) bool {
	for _, sentinel := range []error{client.ErrNotFound, client.ErrDigestMismatch, client.ErrNotStarted,
		client.ErrAlreadyStarted, client.ErrAlreadySettled, client.ErrReleased, client.ErrExpired,
		client.ErrOperationMismatch, client.ErrNoPolicy} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// The linearizability model of one account as its gateways see it: a
// capacity with no refill, reservations that hold units until they are
// settled, and settles that give back reserved minus actual.

// accountInput is one client operation.
type accountInput struct {
	settle bool   // false: reserve
	id     string // reservation id
	units  int64  // reserve: estimate; settle: the reservation's estimate
	actual int64  // settle: actual usage (never above the estimate here)
}

// accountOutput is what the client saw.
type accountOutput struct {
	ok       bool // reserve admitted / settle recorded
	rejected bool // reserve refused for capacity (429)
	unknown  bool // the answer was lost: applied or not
}

// accountState is available capacity and the reservations holding units.
type accountState struct {
	available int64
	held      map[string]int64
}

func (s accountState) with(available int64, id string, units int64, hold bool) accountState {
	held := maps.Clone(s.held)
	if hold {
		held[id] = units
	} else {
		delete(held, id)
	}
	return accountState{available: available, held: held}
}

func (s accountState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "available=%d held=[", s.available)
	for _, id := range slices.Sorted(maps.Keys(s.held)) {
		fmt.Fprintf(&b, " %s:%d", id, s.held[id])
	}
	b.WriteString(" ]")
	return b.String()
}

// accountModel returns the porcupine model for an account of the given
// capacity. A reserve that fits must be admitted and one that does not must
// be refused; a lost answer allows both the applied and the unapplied
// state.
func accountModel(capacity int64) porcupine.Model {
	model := &porcupine.NondeterministicModel{
		Init: func() []interface{} {
			return []interface{}{accountState{available: capacity, held: map[string]int64{}}}
		},
		Step: func(state, input, output interface{}) []interface{} {
			s, in, out := state.(accountState), input.(accountInput), output.(accountOutput)
			if !in.settle {
				fits := in.units <= s.available
				applied := func() accountState { return s.with(s.available-in.units, in.id, in.units, true) }
				switch {
				case out.unknown && fits:
					return []interface{}{s, applied()}
				case out.unknown:
					return []interface{}{s}
				case out.ok && fits:
					return []interface{}{applied()}
				case out.rejected && !fits:
					return []interface{}{s}
				}
				return nil
			}
			units, holds := s.held[in.id]
			if !holds {
				return nil // a settle of a reservation that holds nothing
			}
			settled := s.with(s.available+units-in.actual, in.id, 0, false)
			switch {
			case out.unknown:
				return []interface{}{s, settled}
			case out.ok:
				return []interface{}{settled}
			}
			return nil
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(accountState), b.(accountState)
			return x.available == y.available && maps.Equal(x.held, y.held)
		},
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(accountInput), output.(accountOutput)
			verb := fmt.Sprintf("reserve %s %d", in.id, in.units)
			if in.settle {
				verb = fmt.Sprintf("settle %s %d/%d", in.id, in.actual, in.units)
			}
			switch {
			case out.unknown:
				return verb + " -> ?"
			case out.rejected:
				return verb + " -> 429"
			}
			return verb + " -> ok"
		},
		DescribeState: func(state interface{}) string { return state.(accountState).String() },
	}
	return model.ToModel()
}

// history records client operations with their real-time intervals.
type history struct {
	start time.Time
	ops   []porcupine.Operation
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

// neverReturned is the return time of an operation whose answer was lost:
// later than everything, so porcupine may place it anywhere after its call.
const neverReturned = int64(1) << 62

func admin(t testing.TB, dsn, sql string) {
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
