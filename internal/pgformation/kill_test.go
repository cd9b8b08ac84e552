package pgformation

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The harness's own checks, each against the way it once failed. On one
// formation:
//   - TookOver does not call a failover what left the same node primary
//     on the same timeline (as a restart of the primary does);
//   - WaitHealthy does not call a formation healthy while the standbys
//     the monitor calls secondaries do not stream (the primary refuses
//     their replication connections; the monitor's view lags), and
//     returns once they stream again;
//   - Kill takes down a primary whose postmaster left pg_autoctl's process
//     tree (its "start/stop postgres" service was killed and restarted,
//     the postmaster adopted by init) and leaves its port refusing
//     connections; before Kill looked past the tree it killed the 3
//     pg_autoctl processes and the node went on serving as primary;
//   - Primary reports an error, not the monitor's stale primary, while
//     another node is writable too, and WaitPrimary waits no primary out
//     of it;
//   - a killed node whose pid files (postmaster.pid, pg_autoctl's) name a
//     live process of the postgres user, as a reused PID does, rejoins;
//     before Rejoin removed them, `pg_autoctl run` exited at once ("An
//     instance of pg_autoctl is already running") or never started
//     PostgreSQL (pg_ctl status found the live PID), and the node stayed
//     out of the formation, reported secondary, assigned catchingup;
//   - WaitHealthy returns, saying so, when a node's pg_autoctl has exited
//     (here refusing to start past such a pid file) instead of waiting
//     out its deadline.
func TestHarnessChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a four-process pg_auto_failover formation")
	}
	f := Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, err := f.Primary(ctx)
	if err != nil || primary == nil {
		t.Fatalf("primary: %v %v", primary, err)
	}

	// A node primary on the same timeline as before is no failover,
	// whatever happened in between (a restart of the primary whose
	// pg_autoctl came back before the monitor called it unhealthy looks
	// the same): TookOver says so.
	timeline, err := primary.Timeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after, afterTimeline, err := f.TookOver(ctx, primary, timeline)
	if err == nil || after != primary || afterTimeline != timeline {
		t.Fatalf("TookOver with %s primary on timeline %d as before returned %s (timeline %d), %v; want %s, %d and an error",
			primary.Name, timeline, nameOf(after), afterTimeline, err, primary.Name, timeline)
	}
	t.Logf("TookOver without a failover: %v", err)

	// A killed standby's pid files name a live process of the postgres
	// user (here a sleep, as a PostgreSQL backend that reused the PID
	// would): it rejoins all the same, and that process is left alone.
	var restarted *Node
	for _, n := range f.Nodes {
		if n != primary && restarted == nil {
			restarted = n
		}
	}
	restarted.Kill()
	reused := exec.Command("sleep", "600")
	reused.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred}
	if err := reused.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reused.Process.Kill(); reused.Wait() })
	files := restarted.pidFiles()
	if len(files) < 2 {
		t.Fatalf("%s's pid files: %v; want postmaster.pid and pg_autoctl's, under the formation's directory", restarted.Name, files)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(string(b), "\n")
		if err := os.WriteFile(file, []byte(strconv.Itoa(reused.Process.Pid)+"\n"+rest), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Started past them, as before Rejoin cleared them, pg_autoctl
	// refuses to run; WaitHealthy says so instead of waiting.
	restarted.mu.Lock()
	restarted.proc = f.spawn(restarted.Name, "run", "--pgdata", restarted.PGData)
	restarted.mu.Unlock()
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
	err = f.WaitHealthy(rctx)
	rcancel()
	if err == nil || !strings.Contains(err.Error(), restarted.Name+"'s pg_autoctl exited") || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("WaitHealthy with %s's pg_autoctl refusing to run past its stale pid file: %v; want an error saying it exited", restarted.Name, err)
	}
	t.Logf("WaitHealthy with a stale pid file: %.300s", err)
	restarted.Kill()
	rejoin := time.Now()
	restarted.Rejoin()
	rctx, rcancel = context.WithTimeout(ctx, 2*time.Minute)
	err = f.WaitHealthy(rctx)
	rcancel()
	if err != nil {
		t.Fatalf("%s did not rejoin past pid files naming live PID %d: %v\n%s", restarted.Name, reused.Process.Pid, err, f.Logs())
	}
	if !isAlive(reused.Process.Pid) {
		t.Fatalf("the process %d the stale pid files named did not survive %s's rejoin", reused.Process.Pid, restarted.Name)
	}
	t.Logf("%s rejoined past pid files naming live PID %d in %s", restarted.Name, reused.Process.Pid, time.Since(rejoin).Round(time.Millisecond))

	// While the primary refuses replication connections and its
	// walsenders are gone, the monitor still calls the standbys
	// secondaries for a while, but WaitHealthy does not return; once the
	// standbys may connect again, it waits until they stream.
	hba := filepath.Join(primary.PGData, "pg_hba.conf")
	conf, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hba, append([]byte("host replication all 0.0.0.0/0 reject\n"), conf...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := execOn(ctx, primary.DSN(), "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := execOn(ctx, primary.DSN(), "SELECT pg_terminate_backend(pid) FROM pg_stat_replication"); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	err = f.WaitHealthy(short)
	cancelShort()
	if err == nil {
		n, err := primary.streaming(ctx)
		t.Fatalf("WaitHealthy returned while the primary refused its standbys (it streams to %d, %v)", n, err)
	}
	t.Logf("WaitHealthy while the standbys cannot connect: %v", err)
	if err := os.WriteFile(hba, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := execOn(ctx, primary.DSN(), "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := primary.streaming(ctx); err != nil || n != len(f.Nodes)-1 {
		t.Fatalf("WaitHealthy returned while the primary streams to %d standbys (%v), want %d", n, err, len(f.Nodes)-1)
	}

	// A postmaster outside pg_autoctl's tree dies with the node.
	pm := postmasterPID(primary.PGData)
	service := parentPID(pm)
	root := primary.proc.cmd.Process.Pid
	if err := syscall.Kill(service, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s's postgres service %d: %v", primary.Name, service, err)
	}
	escaped := func() bool {
		for _, pid := range descendants(root) {
			if pid == pm {
				return false
			}
		}
		return len(descendants(root)) >= 3 // pg_autoctl and its two services
	}
	for !escaped() {
		if ctx.Err() != nil {
			t.Fatalf("the postmaster %d did not leave pg_autoctl's tree after its service %d died", pm, service)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if w, err := primary.writable(ctx); err != nil || !w {
		t.Fatalf("%s after its postgres service died: writable %v (%v), want still serving", primary.Name, w, err)
	}
	killed := primary.Kill() // fails the test if the port still accepts connections
	if isAlive(pm) {
		t.Fatalf("postmaster %d alive after Kill", pm)
	}
	t.Logf("killed %s: %d processes, its escaped postmaster %d among them", primary.Name, killed, pm)

	// Once another node is promoted, a second writable node makes Primary
	// fail.
	var next *Node
	for next == nil || next == primary {
		if ctx.Err() != nil {
			t.Fatalf("no promotion after the kill: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
		next, err = f.Primary(ctx)
	}
	var standby *Node
	for _, n := range f.Nodes {
		if n != primary && n != next {
			standby = n
		}
	}
	if err := execOn(ctx, standby.DSN(), "SELECT pg_promote()"); err != nil {
		t.Fatal(err)
	}
	got, err := f.Primary(ctx)
	if err == nil || !strings.Contains(err.Error(), standby.Name+" (port") {
		t.Fatalf("with %s promoted behind the monitor's back, Primary returned %v, %v; want an error naming %s", standby.Name, got, err, standby.Name)
	}
	t.Logf("Primary with two writable nodes: %v", err)
	short, cancelShort = context.WithTimeout(ctx, 10*time.Second)
	got, err = f.WaitPrimary(short)
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), standby.Name+" (port") {
		t.Fatalf("with two writable nodes WaitPrimary returned %s, %v; want an error naming %s", nameOf(got), err, standby.Name)
	}
}

// nameOf is a node's name, or "no node".
func nameOf(n *Node) string {
	if n == nil {
		return "no node"
	}
	return n.Name
}
