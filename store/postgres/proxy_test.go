package postgres_test

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// commitCutter is a TCP proxy between the store and PostgreSQL that can lose
// the answer to a COMMIT: once armed, it forwards the next COMMIT to the
// server, waits for the server's answer (so the transaction is durable) and
// then closes the client's connection instead of relaying it. The client
// sees a connection lost during COMMIT whose transaction did commit, the
// case the store must report as store.ErrUnavailable, never as success or
// as a clean failure.
//
// With a marker (armFor), only the COMMIT of a transaction that sent the
// marker's bytes (a reservation id, say) is cut, so that a server process
// whose workers and lease renewals commit beside it loses the answer of
// the transaction a test means.
type commitCutter struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	marker atomic.Pointer[[]byte]
	cuts   atomic.Int32
	wg     sync.WaitGroup
}

// armFor arms the cutter for the next COMMIT of a transaction that sent
// marker.
func (p *commitCutter) armFor(marker string) {
	m := []byte(marker)
	p.marker.Store(&m)
	p.armed.Store(true)
}

func newCommitCutter(t *testing.T, target string) *commitCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *commitCutter) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		var cut atomic.Bool // set once this connection's COMMIT went to the server
		p.wg.Add(2)
		go func() { // client -> server, watching for COMMIT
			defer p.wg.Done()
			defer server.Close()
			buf := make([]byte, 64<<10)
			// sent is what this connection sent since its last COMMIT,
			// while a marker is armed (to find the marker in it).
			var sent []byte
			for {
				n, err := client.Read(buf)
				if n > 0 {
					marker := p.marker.Load()
					if p.armed.Load() && marker != nil {
						sent = append(sent, buf[:n]...)
					}
					// pgx sends COMMIT as a simple query: 'Q', length, "commit\0".
					if p.armed.Load() && bytes.Contains(buf[:n], []byte("commit\x00")) {
						if (marker == nil || bytes.Contains(sent, *marker)) && p.armed.CompareAndSwap(true, false) {
							cut.Store(true)
						}
						sent = sent[:0]
					}
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server -> client, dropping the answer to the cut COMMIT
			defer p.wg.Done()
			defer client.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && cut.Load() {
					p.cuts.Add(1)
					server.Close()
					return
				}
				if n > 0 {
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// dsnVia returns dsn pointed at the proxy.
func (p *commitCutter) dsnVia(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		t.Skipf("the commit-loss proxy needs a URL DSN in %s", envDSN)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

// targetOf returns host:port of a URL DSN (default port 5432).
func targetOf(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		t.Skipf("the commit-loss proxy needs a URL DSN in %s", envDSN)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "5432"
	}
	return net.JoinHostPort(host, port)
}
