package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/faultproxy"
)

// TestWorkerFailingShowsAStoreOutageOnEveryReplica: docs/OPERATIONS.md,
// "When a worker keeps failing", says to alert on
// capledger_worker_failing at 1 for longer than a store blip. Two replicas
// on one PostgreSQL lose it (the database unreachable from both): once the
// lease lapses neither leads, so no maintenance worker's failure shows
// anywhere; the lease's renewals do, on both, as worker "lease" in
// /metrics and /statusz workers.health, until the store is back.
func TestWorkerFailingShowsAStoreOutageOnEveryReplica(t *testing.T) {
	dsn, proxy := postgresBehindCuttableProxy(t)
	bin := buildBinary(t)
	replicas := []*serverProcess{
		startServer(t, bin, t.TempDir(), "--store", dsn, "--lease-ttl", "900ms"),
		startServer(t, bin, t.TempDir(), "--store", dsn, "--lease-ttl", "900ms"),
	}
	failing := regexp.MustCompile(`(?m)^capledger_worker_failing\{worker="(\w+)"\} 1$`)
	// state returns the workers failing in /metrics, whether this replica
	// leads, and /statusz workers.health.lease.failing.
	state := func(p *serverProcess) (metrics []string, leader, statusLease bool) {
		t.Helper()
		resp, err := http.Get(p.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, m := range failing.FindAllStringSubmatch(string(raw), -1) {
			metrics = append(metrics, m[1])
		}
		var st struct {
			Workers struct {
				Leader bool
				Health map[string]struct{ Failing bool }
			}
		}
		resp, err = http.Get(p.url + "/statusz")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		return metrics, st.Workers.Leader, st.Workers.Health["lease"].Failing
	}
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s; logs:\n%s\n---\n%s", what, replicas[0].logs.String(), replicas[1].logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitUntil("one replica leads", func() bool {
		_, a, _ := state(replicas[0])
		_, b, _ := state(replicas[1])
		return a != b
	})
	for i, p := range replicas {
		if m, _, lease := state(p); len(m) != 0 || lease {
			t.Fatalf("replica %d with its store up: failing %v, statusz lease failing %v", i, m, lease)
		}
	}

	proxy.cut()
	for i, p := range replicas {
		waitUntil("the lease lapses on replica "+string(rune('0'+i)), func() bool {
			return strings.Contains(p.logs.String(), "worker lease lost") || !strings.Contains(p.logs.String(), "worker lease acquired")
		})
	}
	for i, p := range replicas {
		waitUntil("replica "+string(rune('0'+i))+" shows the outage", func() bool {
			m, leader, lease := state(p)
			return !leader && strings.Join(m, ",") == "lease" && lease
		})
	}

	proxy.mend(t)
	for i, p := range replicas {
		waitUntil("replica "+string(rune('0'+i))+" recovers", func() bool {
			m, _, lease := state(p)
			return len(m) == 0 && !lease
		})
	}
}

// TestServeStopsAfterSIGTERMWhileItsStoreHangs: README.md and
// docs/OPERATIONS.md (On call) say a replica is always safe to restart
// with SIGTERM, which waits for in-flight requests up to 30 s. With its
// PostgreSQL hung (packets dropped, connections open) and a call in
// flight that carried no deadline, serve logged the 30 s shutdown
// deadline and then never exited: closing the store waited for that
// call's connection, which nothing ever ends, so only a SIGKILL stopped
// it.
func TestServeStopsAfterSIGTERMWhileItsStoreHangs(t *testing.T) {
	dsn, proxy := postgresBehindProxy(t)
	bin := buildBinary(t)
	// --store-timeout 10m keeps the call in flight past the shutdown's
	// deadline, as a call without a deadline was kept before serve
	// bounded each call's wait for the store (storehang_test.go): the
	// store's close still waits for its connection.
	srv := startServer(t, bin, t.TempDir(), "--store", dsn, "--store-timeout", "10m")
	resp, err := http.Get(srv.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz before the hang: %s", resp.Status)
	}
	proxy.SetFaults(faultproxy.Faults{Partition: true})
	go post(&http.Client{}, srv.url, "Reserve", `{"reservationId":"hang-1","subject":"s","route":"r","units":{"tokens":1}}`)
	time.Sleep(500 * time.Millisecond) // let the call reach the store
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil || !strings.Contains(srv.logs.String(), "stopped without closing the store") {
			t.Errorf("serve after SIGTERM: %v (want exit 0, logging \"stopped without closing the store\")\n%s", err, srv.logs.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("serve still running 3 minutes after SIGTERM while its store hangs:\n%s", srv.logs.String())
	}
}
