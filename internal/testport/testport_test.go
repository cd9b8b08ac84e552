package testport

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

// Ports come from below the ephemeral range, and a server can listen on
// the one handed out.
func TestPortBelowTheEphemeralRangeAndFree(t *testing.T) {
	for range 50 {
		port := Port(t)
		if port < Lo || port >= Hi || port >= 32768 {
			t.Fatalf("port %d, want one in [%d, %d), below 32768", port, Lo, Hi)
		}
		ln, err := net.Listen("tcp", Addr(t))
		if err != nil {
			t.Fatalf("listen on a handed-out address: %v", err)
		}
		ln.Close()
	}
}

// A port a server holds is not handed out: the walk skips it.
func TestPortSkipsAHeldPort(t *testing.T) {
	held := Port(t)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(held)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	mu.Lock()
	next = held // the walk is at the held port
	mu.Unlock()
	if got := Port(t); got == held {
		t.Fatalf("port %d handed out while a server holds it", got)
	}
}

// Callers in parallel (tests of one binary, t.Parallel) never get the same
// port: the walk hands each port out once per lap of the range.
func TestPortDistinctAcrossGoroutines(t *testing.T) {
	const workers, each = 8, 25
	var (
		wg   sync.WaitGroup
		lock sync.Mutex
		seen = map[int]bool{}
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				port := Port(t)
				lock.Lock()
				if seen[port] {
					t.Errorf("port %d handed out twice", port)
				}
				seen[port] = true
				lock.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != workers*each {
		t.Fatalf("%d distinct ports for %d calls", len(seen), workers*each)
	}
}
