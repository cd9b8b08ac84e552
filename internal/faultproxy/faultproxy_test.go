package faultproxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// backend is a real HTTP server on a real socket that counts the requests
// it handled.
func backend(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var handled atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		handled.Add(1)
		w.Write([]byte("echo:" + string(body)))
	}))
	t.Cleanup(srv.Close)
	return srv, &handled
}

func start(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func post(t *testing.T, hc *http.Client, addr, body string) (string, error) {
	t.Helper()
	resp, err := hc.Post("http://"+addr+"/", "text/plain", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestForwardsWithoutFaults(t *testing.T) {
	srv, handled := backend(t)
	p := start(t, srv.Listener.Addr().String())
	hc := &http.Client{Timeout: 5 * time.Second}
	for i := 0; i < 20; i++ {
		got, err := post(t, hc, p.Addr(), "x")
		if err != nil || got != "echo:x" {
			t.Fatalf("request %d: %q, %v", i, got, err)
		}
	}
	if handled.Load() != 20 {
		t.Fatalf("backend handled %d, want 20", handled.Load())
	}
	st := p.Stats()
	if st.Faulted() != 0 || st.Accepted == 0 {
		t.Fatalf("stats %+v", st)
	}
	// Keep-alive connections are reused through the proxy.
	if st.Accepted > 2 {
		t.Fatalf("accepted %d connections for 20 sequential requests, want reuse", st.Accepted)
	}
}

func TestDroppedResponseWasApplied(t *testing.T) {
	srv, handled := backend(t)
	p := start(t, srv.Listener.Addr().String())
	p.SetFaults(Faults{DropResponse: 1})
	hc := &http.Client{Timeout: 5 * time.Second}
	if got, err := post(t, hc, p.Addr(), "lost"); err == nil {
		t.Fatalf("answer %q arrived through a proxy that drops every answer", got)
	}
	// The server did the work: that is what makes a lost answer dangerous.
	if handled.Load() != 1 {
		t.Fatalf("backend handled %d, want 1", handled.Load())
	}
	if st := p.Stats(); st.DroppedResponses != 1 || st.Cut != 1 {
		t.Fatalf("stats %+v", st)
	}
	p.SetFaults(Faults{})
	if got, err := post(t, hc, p.Addr(), "ok"); err != nil || got != "echo:ok" {
		t.Fatalf("after lifting faults: %q, %v", got, err)
	}
}

func TestDroppedRequestNeverArrives(t *testing.T) {
	srv, handled := backend(t)
	p := start(t, srv.Listener.Addr().String())
	p.SetFaults(Faults{DropRequest: 1})
	hc := &http.Client{Timeout: 5 * time.Second}
	if _, err := post(t, hc, p.Addr(), "x"); err == nil {
		t.Fatal("request went through a proxy that drops every request")
	}
	if handled.Load() != 0 {
		t.Fatalf("backend handled %d, want 0", handled.Load())
	}
	if p.Stats().DroppedRequests == 0 {
		t.Fatalf("stats %+v", p.Stats())
	}
}

func TestTruncatedResponseIsAnError(t *testing.T) {
	srv, _ := backend(t)
	p := start(t, srv.Listener.Addr().String())
	p.SetFaults(Faults{TruncateResponse: 1})
	hc := &http.Client{Timeout: 5 * time.Second}
	if got, err := post(t, hc, p.Addr(), "torn"); err == nil {
		t.Fatalf("torn answer read as %q without error", got)
	}
	if p.Stats().TruncatedResponse != 1 {
		t.Fatalf("stats %+v", p.Stats())
	}
}

func TestPartitionTimesOutThenHeals(t *testing.T) {
	srv, _ := backend(t)
	p := start(t, srv.Listener.Addr().String())
	p.SetFaults(Faults{Partition: true})
	hc := &http.Client{Timeout: 200 * time.Millisecond}
	_, err := post(t, hc, p.Addr(), "x")
	var ne net.Error
	if err == nil || !(asNetError(err, &ne) && ne.Timeout()) {
		t.Fatalf("want a timeout in a partition, got %v", err)
	}
	if p.Stats().Partitioned == 0 {
		t.Fatalf("stats %+v", p.Stats())
	}
	p.SetFaults(Faults{})
	hc.Timeout = 5 * time.Second
	if got, err := post(t, hc, p.Addr(), "healed"); err != nil || got != "echo:healed" {
		t.Fatalf("after the partition: %q, %v", got, err)
	}
}

func TestDelayAndCutAll(t *testing.T) {
	srv, _ := backend(t)
	p := start(t, srv.Listener.Addr().String())
	p.SetFaults(Faults{Delay: time.Millisecond})
	hc := &http.Client{Timeout: 5 * time.Second}
	if _, err := post(t, hc, p.Addr(), "x"); err != nil {
		t.Fatal(err)
	}
	if p.Stats().Delayed == 0 {
		t.Fatalf("stats %+v", p.Stats())
	}
	p.CutAll()
	if p.Stats().Cut == 0 {
		t.Fatalf("CutAll cut nothing: %+v", p.Stats())
	}
	// A POST on the cut keep-alive connection may fail (net/http does not
	// resend non-idempotent requests); the next one dials again.
	if _, err := post(t, hc, p.Addr(), "maybe"); err != nil {
		t.Logf("first request after CutAll: %v", err)
	}
	if got, err := post(t, hc, p.Addr(), "again"); err != nil || got != "echo:again" {
		t.Fatalf("after CutAll: %q, %v", got, err)
	}
}

func asNetError(err error, target *net.Error) bool { return errors.As(err, target) }

func TestDropNextResponses(t *testing.T) {
	srv, handled := backend(t)
	p := start(t, srv.Listener.Addr().String())
	p.DropNextResponses(2)
	hc := &http.Client{Timeout: 5 * time.Second}
	for i := 0; i < 2; i++ {
		if _, err := post(t, hc, p.Addr(), "x"); err == nil {
			t.Fatalf("answer %d arrived, want it dropped", i)
		}
	}
	if got, err := post(t, hc, p.Addr(), "third"); err != nil || got != "echo:third" {
		t.Fatalf("third request: %q, %v", got, err)
	}
	if handled.Load() != 3 || p.Stats().DroppedResponses != 2 {
		t.Fatalf("handled %d, stats %+v", handled.Load(), p.Stats())
	}
}
