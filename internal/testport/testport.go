// Package testport picks loopback TCP ports for servers a test starts
// where it cannot hand them an open listener: a child process (capledger
// serve, redis-server, PostgreSQL) or a server restarted on the same
// address. It is test support: only tests and test helpers import it.
//
// A port the kernel picks for 127.0.0.1:0 comes from the ephemeral range
// (32768-60999 on Linux), the range outgoing connections take their local
// ports from: between closing such a listener and the child binding the
// port, a connection of another test (or of another package's test binary,
// which go test runs in parallel) may take it. The child then fails with
// "address already in use", or a client talks to another server. Ports
// here come from below that range, [Lo, Hi), where the kernel hands out
// none on its own.
//
// Each test process starts at its own point of the range (its pid and a
// random draw) and walks it upwards, so two processes rarely pick the same
// port and one process never picks a port twice before it has walked the
// whole range; a port is handed out only after binding it succeeded, so a
// port a running server holds is skipped.
package testport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
)

// Lo and Hi bound the ports handed out: [Lo, Hi), below Linux's ephemeral
// range (net.ipv4.ip_local_port_range, 32768-60999 by default).
const (
	Lo = 20000
	Hi = 32000
)

// tries is how many ports one call tries before it fails the test.
const tries = 200

var (
	mu   sync.Mutex
	next int // the next port to try; 0 until the first call
)

// candidate returns the next port of this process's walk of [Lo, Hi).
func candidate() int {
	mu.Lock()
	defer mu.Unlock()
	if next == 0 {
		// Start at a point of the range that differs between processes:
		// the pid spreads test binaries started together, the random
		// draw spreads runs that reuse pids.
		next = Lo + (os.Getpid()*7919+rand.IntN(Hi-Lo))%(Hi-Lo)
	}
	port := next
	if next++; next >= Hi {
		next = Lo
	}
	return port
}

// Port returns a loopback port below the ephemeral range that nothing
// listened on when it was checked (by binding it); the caller's server is
// to listen on 127.0.0.1 at that port. It fails t if none of many ports
// was free.
func Port(t testing.TB) int {
	t.Helper()
	var lastErr error
	for range tries {
		port := candidate()
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			lastErr = err
			continue
		}
		ln.Close()
		return port
	}
	t.Fatalf("testport: no free loopback port in %d tries of [%d, %d): %v", tries, Lo, Hi, lastErr)
	return 0
}

// Addr returns "127.0.0.1:PORT" for a Port: an address nothing listens on
// now, for a server the test starts there, or for a client that must find
// nothing there.
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t)))
}
