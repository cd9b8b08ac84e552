package main

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/testport"
)

// startRedis runs a redis-server of its own on a free loopback port (the
// Debian package's binary), with extra flags, and returns its address; the
// test is skipped where redis-server is not installed.
func startRedis(t *testing.T, flags ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	addr := testport.Addr(t)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", dir}, flags...)...)
	childproc.DieWithParent(cmd)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBenchRedisBaseline drives a real redis-server (append-only file,
// fsync always) with both Redis modes and checks that the token bucket
// ran: every call admitted, the bucket's hash written, the batch mode's
// units counted per EVALSHA, and a bucket that runs out reported as
// rejections, not as throughput.
func TestBenchRedisBaseline(t *testing.T) {
	addr := startRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	common := []string{"bench", "--concurrency", "2", "--duration", "300ms", "--warmup", "0s", "--progress=false"}
	code, out, errOut := cli(t, addr, append(common, "--mode", "redis")...)
	wantExit(t, exitOK, code, out, errOut)
	if ops, _ := strconv.Atoi(benchRow(t, out, "ops")); ops == 0 || benchRow(t, out, "errors") != "0" || benchRow(t, out, "rejected") != "0" {
		t.Fatalf("redis baseline:\n%s", out)
	}
	code, out, errOut = cli(t, addr, append(common, "--mode", "redis-batch", "--batch-size", "50")...)
	wantExit(t, exitOK, code, out, errOut)
	perSec, _ := strconv.ParseFloat(benchRow(t, out, "reservations/s"), 64)
	opsPerSec, _ := strconv.ParseFloat(benchRow(t, out, "ops/s"), 64)
	if opsPerSec == 0 || perSec < 49*opsPerSec || benchRow(t, out, "errors") != "0" {
		t.Fatalf("redis batch of 50: %v reservations/s for %v ops/s:\n%s", perSec, opsPerSec, out)
	}
	// A bucket smaller than one call's cost refuses everything.
	code, out, errOut = cli(t, addr, append(common, "--mode", "redis", "--units", strconv.Itoa(1<<52))...)
	wantExit(t, exitUnavailable, code, out, errOut)
	if benchRow(t, out, "rejected") == "0" {
		t.Fatalf("an empty bucket was not reported as rejections:\n%s", out)
	}
}

// TestRedisConnAnswers reads every RESP answer type bench handles, from a
// real redis-server, and a script error as an error answer that leaves the
// connection usable.
func TestRedisConnAnswers(t *testing.T) {
	addr := startRedis(t)
	c, err := dialRedis(t.Context(), addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.conn.Close()
	c.send("PING")
	c.send("SET", "k", "v\r\nwith a line break")
	c.send("GET", "k")
	c.send("GET", "missing")
	c.send("INCRBY", "n", "41")
	c.send("EVALSHA", "0000000000000000000000000000000000000000", "0")
	c.send("INCR", "n")
	if err := c.w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := []any{"PONG", "OK", "v\r\nwith a line break", nil, int64(41), "error", int64(42)}
	for i, w := range want {
		got, err := c.receive()
		if w == "error" {
			if _, ok := err.(redisError); !ok || !strings.Contains(err.Error(), "NOSCRIPT") {
				t.Fatalf("answer %d: %v, %v; want a NOSCRIPT error", i, got, err)
			}
			continue
		}
		if err != nil || got != w {
			t.Fatalf("answer %d: %#v, %v; want %#v", i, got, err, w)
		}
	}
}
