//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/capledger/capledger/internal/tmpfs"
)

// setFileSizeLimit sets the soft RLIMIT_FSIZE of the running process pid
// (prlimit(2); the hard limit is left as it is) and returns the previous
// soft limit. Below a file's size, every write(2) past the limit fails
// with EFBIG, as writes fail on a full disk: SQLite sees an I/O error.
// Go ignores the SIGXFSZ that comes with it.
func setFileSizeLimit(t *testing.T, pid int, soft uint64) uint64 {
	t.Helper()
	var old syscall.Rlimit
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_FSIZE,
		0, uintptr(unsafe.Pointer(&old)), 0, 0); errno != 0 {
		t.Fatalf("prlimit get: %v", errno)
	}
	limit := syscall.Rlimit{Cur: soft, Max: old.Max}
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_FSIZE,
		uintptr(unsafe.Pointer(&limit)), 0, 0, 0); errno != 0 {
		t.Fatalf("prlimit set: %v", errno)
	}
	return old.Cur
}

// TestFullDiskThenRoomAgain runs concurrent gateways against a real
// `capledger serve` whose every file write starts failing (the running
// process's RLIMIT_FSIZE is lowered to one byte, so SQLite's WAL and
// checkpoint writes fail as on a full disk), then gets its room back
// without a restart. While the disk is full no reserve, start or settle
// sent after the fault began may be acknowledged (nothing can be
// committed), the server keeps answering them 503 and /readyz says not
// ready; once there is room it is ready and acknowledges again by itself. Then, on the same process (whatever it
// kept in memory from the failed batches must not leak into later ones)
// and again after a SIGKILL and restart: every acknowledged step is
// stored as the client sent it, nothing is half applied, the audit is
// clean, and retrying the unacknowledged reserves converges.
func TestFullDiskThenRoomAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two server processes")
	}
	bin := buildBinary(t)
	dataDir := t.TempDir()
	srv := startServer(t, bin, dataDir)
	client := &http.Client{Timeout: 10 * time.Second}
	policy := `{"policy":{"subject":"*","route":"chat","holdTtl":"3600s",
	  "dimensions":[{"unit":"tokens","burst":"100000000","refillUnits":"1000","refillInterval":"1s"},
	                {"unit":"requests","burst":"1000000"}]}}`
	if status, body := post(client, srv.url, "PublishPolicy", policy); status != 200 {
		t.Fatalf("publish: %d %v", status, body)
	}

	var (
		mu      sync.Mutex
		records = map[string]*record{}
		// fullSince is when the limit was lowered (UnixNano), 0 while
		// there is room.
		fullSince atomic.Int64
		acks      atomic.Int64
		refusals  atomic.Int64 // answered, but not 200, while full
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	const workers = 8
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// call sends one step and reports whether it was acknowledged;
			// an acknowledgement of a call sent after the disk filled up is
			// an error: nothing could have been committed.
			call := func(id, method, body string) bool {
				sentFull := fullSince.Load() != 0
				status, out := post(client, srv.url, method, body)
				switch {
				case status == 200 && sentFull && fullSince.Load() != 0:
					t.Errorf("%s %s acknowledged while no write could succeed: %v", method, id, out)
				case status == 200:
					acks.Add(1)
				case fullSince.Load() != 0 && status != 0:
					refusals.Add(1)
					// docs/OPERATIONS.md: the callers of a failed batch get
					// 503 and retry with the same ids.
					if status != http.StatusServiceUnavailable {
						t.Errorf("%s %s while the disk was full: %d %v, want 503", method, id, status, out)
					}
				}
				return status == 200
			}
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				r := &record{
					id:       fmt.Sprintf("w%d-%d", w, k),
					subject:  fmt.Sprintf("tenant-%d", (w+k)%5),
					reserved: int64(100 + (w*37+k*11)%400),
				}
				r.actual = r.reserved / 2
				mu.Lock()
				records[r.id] = r
				mu.Unlock()
				ack := func(s step) {
					mu.Lock()
					r.acked = s
					mu.Unlock()
				}
				if !call(r.id, "Reserve", fmt.Sprintf(
					`{"reservationId":%q,"subject":%q,"route":"chat","units":{"tokens":%d,"requests":1}}`, r.id, r.subject, r.reserved)) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				ack(stepReserved)
				if k%3 == 0 {
					continue // leave some reservations held
				}
				if !call(r.id, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, r.id, r.id)) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				ack(stepStarted)
				if k%3 == 1 {
					continue // leave some started
				}
				if !call(r.id, "Settle", fmt.Sprintf(
					`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d,"requests":1}}`, r.id, r.id, r.actual)) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				ack(stepSettled)
			}
		}()
	}
	waitAcks := func(n int64, what string) {
		t.Helper()
		target := acks.Load() + n
		deadline := time.Now().Add(60 * time.Second)
		for acks.Load() < target {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: only %d of %d acknowledgements within a minute; logs:\n%s", what, acks.Load(), target, srv.logs.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitAcks(300, "before the fault")

	// The limit first, then the mark; the mark off before the room comes
	// back: a call sent after the mark and answered before it went off
	// ran wholly while nothing could be written.
	old := setFileSizeLimit(t, srv.cmd.Process.Pid, 1)
	fullSince.Store(time.Now().UnixNano())
	deadline := time.Now().Add(20 * time.Second)
	for refusals.Load() < 50 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let workers and maintenance hit it too
	// Not ready while no write can succeed (docs/OPERATIONS.md: a store
	// that reads but refuses writes stays not ready) ...
	addr := strings.TrimPrefix(srv.url, "http://")
	if status, body := readyz(t, addr); status != http.StatusServiceUnavailable {
		t.Errorf("/readyz while the disk is full: %d %s, want 503", status, body)
	}
	fullSince.Store(0)
	setFileSizeLimit(t, srv.cmd.Process.Pid, old)
	// ... and ready again by itself once there is room.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if status, _ := readyz(t, addr); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("/readyz not ready 10 s after room came back")
			break
		}
	}
	if refusals.Load() < 50 {
		close(stop)
		wg.Wait()
		t.Fatalf("only %d calls refused while the disk was full: the fault was not injected", refusals.Load())
	}
	waitAcks(300, "after room came back")
	close(stop)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d calls refused while the disk was full", refusals.Load())

	t.Run("same process", func(t *testing.T) { verify(t, srv.url, records) })
	if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Wait()
	restarted := startServer(t, bin, dataDir)
	t.Run("after a restart", func(t *testing.T) { verify(t, restarted.url, records) })
	stopGracefully(t, restarted)
}

// TestServeRestartedOnAFullDisk: `capledger serve` restarted on a SQLite
// data directory whose disk is still full exits 5 (store unavailable,
// what a supervisor retries on) saying the disk is full and where,
// instead of SQLite's bare "disk I/O error (4874)"; once there is room
// it starts again. Needs root to mount a size-limited tmpfs; skipped
// otherwise.
func TestServeRestartedOnAFullDisk(t *testing.T) {
	dir := tmpfs.Mount(t, "8m")
	data := filepath.Join(dir, "data")
	e := &env{getenv: func(string) string { return "" }}
	// serveOnce starts serve on data and stops it once it listens; it
	// returns serve's exit code and output.
	serveOnce := func() (int, string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		logs := &lockedBuffer{}
		e.stdout, e.stderr = logs, logs
		done := make(chan int, 1)
		go func() { done <- run(ctx, e, []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", data}) }()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			select {
			case code := <-done:
				return code, logs.String()
			default:
			}
			if listeningLine.MatchString(logs.String()) {
				cancel()
				return <-done, logs.String()
			}
			if time.Now().After(deadline) {
				t.Fatalf("serve neither listened nor exited:\n%s", logs.String())
			}
		}
	}
	if code, out := serveOnce(); code != exitOK {
		t.Fatalf("first start: exit %d:\n%s", code, out)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 4<<10); ; {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	code, out := serveOnce()
	if want := "no room in " + data + " (0 bytes free): no space left on device"; code != exitUnavailable || !strings.Contains(out, want) {
		t.Fatalf("serve on a full disk: exit %d, want %d with %q:\n%s", code, exitUnavailable, want, out)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code, out := serveOnce(); code != exitOK {
		t.Fatalf("serve once there is room again: exit %d:\n%s", code, out)
	}
}
