// Package pgformation runs a real pg_auto_failover formation for tests: a
// monitor and three PostgreSQL 15 nodes on loopback ports, one primary and
// two synchronous-quorum standbys (number-sync-standbys 1), trust
// authentication on 127.0.0.1, each in its own temporary directory, with
// the monitor tuned to fail over within seconds of a primary's death.
//
// The processes run as the `postgres` user when the test runs as root
// (initdb refuses root), with /usr/lib/postgresql/15/bin first on PATH and
// their own HOME and XDG directories, so nothing of the machine's own
// PostgreSQL (its data directory, its port 5432, its configuration) is
// touched. Every process a formation starts is killed, waited for, and its
// directories removed when the test ends, pass or fail.
//
// Start skips the test, saying what to install, where the Debian packages
// postgresql-15-auto-failover and pg-auto-failover-cli are missing, unless
// CAPLEDGER_TEST_PGAUTOFAILOVER is set (CI sets it after installing them):
// then a missing package fails the test, so CI never passes by skipping.
package pgformation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/internal/testport"
)

// EnvRequire names the variable that turns a missing installation from a
// skip into a failure.
const EnvRequire = "CAPLEDGER_TEST_PGAUTOFAILOVER"

// BinDir holds the PostgreSQL 15 server binaries pg_autoctl drives.
const BinDir = "/usr/lib/postgresql/15/bin"

// Database is the database every node serves (created by pg_autoctl).
const Database = "test"

// MonitorSettings are the monitor's health-check settings: a dead primary
// is noticed within about a second and demoted after 3 s, instead of the
// defaults' 20-30 s.
var MonitorSettings = map[string]string{
	"pgautofailover.health_check_period":               "1000",
	"pgautofailover.health_check_timeout":              "1000",
	"pgautofailover.health_check_max_retries":          "1",
	"pgautofailover.health_check_retry_delay":          "500",
	"pgautofailover.node_considered_unhealthy_timeout": "3000",
	"pgautofailover.primary_demote_timeout":            "3000",
}

// Node is one PostgreSQL node of the formation, supervised by its own
// `pg_autoctl run` process.
type Node struct {
	Name   string
	Port   int
	PGData string

	f    *Formation
	mu   sync.Mutex
	proc *process
	runs int
}

// Formation is a running monitor and its nodes.
type Formation struct {
	t       testing.TB
	dir     string
	cred    *syscall.Credential
	env     []string
	monitor *process
	// MonitorPort is the monitor's PostgreSQL port.
	MonitorPort int
	Nodes       []*Node
}

// process is one pg_autoctl process tree: the command, its log, and a
// channel closed when the command has been waited for.
type process struct {
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   *sync.Mutex
	done chan struct{}
}

// lockedBuffer is a bytes.Buffer safe to write from the process's output
// copier while a failing test reads it.
type lockedBuffer struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (b lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Missing returns why a formation cannot run on this machine ("" when it
// can): a package not installed, or no `postgres` user to run it as.
func Missing() string {
	var missing []string
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		missing = append(missing, "pg_autoctl (Debian package pg-auto-failover-cli)")
	}
	if _, err := os.Stat("/usr/share/postgresql/15/extension/pgautofailover.control"); err != nil {
		missing = append(missing, "the pgautofailover extension for PostgreSQL 15 (Debian package postgresql-15-auto-failover)")
	}
	if _, err := os.Stat(filepath.Join(BinDir, "pg_ctl")); err != nil {
		missing = append(missing, BinDir+"/pg_ctl (Debian package postgresql-15)")
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			missing = append(missing, "a postgres user to run PostgreSQL as (initdb refuses root)")
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return "missing " + strings.Join(missing, ", ") +
		"; install with: apt-get install -y postgresql-15-auto-failover pg-auto-failover-cli"
}

// Start brings a formation up (a monitor and nodes nodes, the first one
// primary) and returns it once every standby is a synchronous-quorum
// secondary; it registers the teardown with t.Cleanup. On this machine
// kind it takes about 20-40 s, and over three minutes at load 30-40 (the
// first node alone took 2m20s to become single). It fails the test if the
// formation does not come up within six minutes, and at once, with its
// output, if a node's pg_autoctl exits.
func Start(t testing.TB, nodes int) *Formation {
	t.Helper()
	if why := Missing(); why != "" {
		if os.Getenv(EnvRequire) != "" {
			t.Fatalf("pg_auto_failover formation: %s (%s is set, so this is a failure, not a skip)", why, EnvRequire)
		}
		t.Skipf("pg_auto_failover formation: %s (set %s to make this a failure)", why, EnvRequire)
	}
	if nodes < 2 {
		t.Fatalf("pgformation: %d nodes: a failover needs at least 2", nodes)
	}
	dir, err := os.MkdirTemp("", "capledger-pgaf-")
	if err != nil {
		t.Fatal(err)
	}
	f := &Formation{t: t, dir: dir}
	t.Cleanup(f.teardown)
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		f.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	// pg_autoctl keeps its pid files under $XDG_RUNTIME_DIR/pg_autoctl/,
	// or under /tmp/pg_autoctl/ (shared by every formation on the machine,
	// and left behind by the teardown) when that directory does not exist.
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	if f.cred != nil {
		if err := os.Chown(filepath.Join(dir, "run"), int(f.cred.Uid), int(f.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	f.env = []string{
		"PATH=" + BinDir + ":/usr/bin:/bin:/usr/sbin:/sbin",
		"HOME=" + dir,
		"XDG_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"XDG_DATA_HOME=" + filepath.Join(dir, "share"),
		"XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"),
		"PGHOST=127.0.0.1",
		"LANG=C.UTF-8",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	f.MonitorPort = freePort(t)
	f.monitor = f.spawn("monitor", "create", "monitor", "--pgdata", filepath.Join(dir, "monitor"),
		"--pgport", strconv.Itoa(f.MonitorPort), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
		"--auth", "trust", "--no-ssl", "--run")
	if err := f.waitMonitor(ctx); err != nil {
		t.Fatalf("pg_auto_failover monitor did not come up: %v\n%s", err, f.monitor.output())
	}
	for i := range nodes {
		n := &Node{Name: fmt.Sprintf("node%d", i+1), Port: freePort(t), f: f}
		n.PGData = filepath.Join(dir, n.Name)
		f.Nodes = append(f.Nodes, n)
	}
	// The first node alone becomes "single" (the primary); the standbys
	// then clone it together.
	f.Nodes[0].create()
	if err := f.waitStates(ctx, map[string]int{"single": 1}, nil); err != nil {
		t.Fatalf("first node did not become single: %v\n%s", err, f.Nodes[0].output())
	}
	for _, n := range f.Nodes[1:] {
		n.create()
	}
	if err := f.WaitHealthy(ctx); err != nil {
		t.Fatalf("formation did not become healthy: %v\n%s", err, f.Logs())
	}
	if err := f.monitorExec(ctx, "SELECT pgautofailover.set_formation_number_sync_standbys('default', 1)"); err != nil {
		t.Fatalf("number-sync-standbys 1: %v", err)
	}
	if err := f.WaitHealthy(ctx); err != nil {
		t.Fatalf("formation did not become healthy: %v\n%s", err, f.Logs())
	}
	return f
}

// freePort is a port for a node's PostgreSQL below the ephemeral range
// (testport.Port): no outgoing connection takes it before the node binds it.
func freePort(t testing.TB) int {
	t.Helper()
	return testport.Port(t)
}

// MonitorDSN is the monitor database's connection string.
func (f *Formation) MonitorDSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable&connect_timeout=2", f.MonitorPort)
}

// DSN is a multi-host connection string listing every node with
// target_session_attrs=read-write, as an operator gives it to
// `capledger serve --store`: it reaches whichever node is primary.
// params are appended ("search_path=x").
func (f *Formation) DSN(params ...string) string {
	hosts := make([]string, len(f.Nodes))
	for i, n := range f.Nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.Port)
	}
	q := append([]string{"sslmode=disable", "target_session_attrs=read-write", "connect_timeout=2"}, params...)
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + Database + "?" + strings.Join(q, "&")
}

// NodeDSN is one node's connection string, whatever its role.
func (n *Node) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", n.Port, Database)
}

// spawn starts `pg_autoctl args...` as the postgres user in its own process
// group.
func (f *Formation) spawn(name string, args ...string) *process {
	cmd := exec.Command("pg_autoctl", args...)
	cmd.Env = f.env
	cmd.Dir = f.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: f.cred}
	p := &process{cmd: cmd, log: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	out := lockedBuffer{mu: p.mu, buf: p.log}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		f.t.Fatalf("start pg_autoctl %s: %v", name, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	return p
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.log.String()
	if len(s) > 8000 {
		s = "…" + s[len(s)-8000:]
	}
	return s
}

// Logs returns the tail of every node's pg_autoctl output, for a failure
// message.
func (f *Formation) Logs() string {
	var b strings.Builder
	for _, n := range f.Nodes {
		fmt.Fprintf(&b, "--- %s (port %d)\n%s\n", n.Name, n.Port, n.output())
	}
	return b.String()
}

func (n *Node) create() {
	n.mu.Lock()
	defer n.mu.Unlock()
	monitor := fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", n.f.MonitorPort)
	n.proc = n.f.spawn(n.Name, "create", "postgres", "--pgdata", n.PGData, "--pgport", strconv.Itoa(n.Port),
		"--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--name", n.Name, "--dbname", Database,
		"--monitor", monitor, "--auth", "trust", "--no-ssl", "--run")
	n.runs++
}

func (n *Node) output() string {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return "(not running)"
	}
	return p.output()
}

// exited returns a node whose pg_autoctl supervisor has exited though
// nothing killed it, and how it ended; nil if there is none.
func (f *Formation) exited() (*Node, string) {
	for _, n := range f.Nodes {
		n.mu.Lock()
		p := n.proc
		n.mu.Unlock()
		if p == nil {
			continue
		}
		select {
		case <-p.done:
			return n, p.cmd.ProcessState.String()
		default:
		}
	}
	return nil, ""
}

// Running reports whether the node's pg_autoctl supervisor is running.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil
}

// Kill SIGKILLs the node's whole process tree (pg_autoctl, its services,
// the postmaster and every backend) at once, as a machine crash would, and
// waits until every one of those processes is gone. It returns the number
// of processes killed.
//
// The node's PostgreSQL processes die with it even where they have left
// pg_autoctl's tree: when pg_autoctl's "start/stop postgres" service dies,
// its supervisor starts another, which adopts the running postmaster, now
// a child of init. Kill finds them by the postmaster.pid file and by their
// working directory (the data directory), and says so in the test log.
// Afterwards it fails the test unless every process is gone and the
// node's port refuses connections: a kill that leaves the node serving
// would make a failover test pass without a failover.
func (n *Node) Kill() int {
	killed, err := n.kill()
	if err != nil {
		n.f.t.Fatalf("pgformation: kill %s: %v", n.Name, err)
	}
	return killed
}

func (n *Node) kill() (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return 0, nil
	}
	root := n.proc.cmd.Process.Pid
	tree := map[int]bool{}
	for _, pid := range descendants(root) {
		tree[pid] = true
	}
	pm := postmasterPID(n.PGData)
	roots := []int{root}
	outside := map[int]bool{}
	for _, pid := range n.f.processesIn(n.PGData) {
		// Not in the tree read above, and not forked into it since.
		if !tree[pid] && !descendsFrom(pid, root) {
			outside[pid] = true
			roots = append(roots, pid)
		}
	}
	if len(outside) > 0 {
		// Name the tops of the escaped trees (the postmaster, typically).
		var tops []string
		for pid := range outside {
			if parent := parentPID(pid); !outside[parent] {
				what := "process"
				if pid == pm {
					what = "postmaster"
				}
				tops = append(tops, fmt.Sprintf("%s %d (parent %d)", what, pid, parent))
			}
		}
		n.f.t.Logf("pgformation: kill %s: %d PostgreSQL processes outside pg_autoctl's process tree (pid %d), killed with it: %s",
			n.Name, len(outside), root, strings.Join(tops, ", "))
	}
	killed, survivors := n.f.killTrees(roots...)
	<-n.proc.done
	n.proc = nil
	// Whatever a stopped process forked before it stopped is found here.
	if more := n.f.processesIn(n.PGData); len(more) > 0 {
		k, s := n.f.killTrees(more...)
		killed += k
		survivors = append(survivors, s...)
	}
	if len(survivors) > 0 {
		return killed, fmt.Errorf("processes %v still alive 30 s after SIGKILL", survivors)
	}
	if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.Port), 2*time.Second); err == nil {
		conn.Close()
		return killed, fmt.Errorf("port %d still accepts connections after %d processes were killed (postmaster.pid names %d)",
			n.Port, killed, postmasterPID(n.PGData))
	}
	return killed, nil
}

// Rejoin starts the node's supervisor again (`pg_autoctl run`) after Kill;
// pg_auto_failover then rewinds or re-clones it and it rejoins as a
// standby. Wait with WaitHealthy. It first removes the pid files the
// killed node left that name a live process of someone else
// (clearStalePidFiles), saying so in the test log.
func (n *Node) Rejoin() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		return
	}
	n.clearStalePidFiles()
	n.proc = n.f.spawn(n.Name, "run", "--pgdata", n.PGData)
	n.runs++
}

// pidFiles returns the pid files of the node: its postmaster.pid and
// pg_autoctl's (the supervisor's and its services').
func (n *Node) pidFiles() []string {
	files, _ := filepath.Glob(filepath.Join(n.f.dir, "run", "pg_autoctl", n.PGData, "*.pid"))
	return append([]string{filepath.Join(n.PGData, "postmaster.pid")}, files...)
}

// clearStalePidFiles removes each pid file of the stopped node that names
// a live process which is not one of the node's. PostgreSQL and pg_autoctl
// both take a pid file whose PID answers kill(pid, 0) for a running
// instance: `pg_autoctl run` exits at once ("An instance of pg_autoctl is
// already running with PID ..."), leaving the node down for good; and with
// a live PID in postmaster.pid, pg_autoctl believes PostgreSQL runs
// (pg_ctl status says so), never starts it, and signals that process when
// it tries to stop it. A SIGKILLed node leaves its pid files behind, and
// with pid_max 32768 on a busy machine its PIDs are soon handed to other
// processes; one of the postgres user (a backend of any PostgreSQL on the
// machine) makes the file look current. A file naming a dead PID is left
// alone (both programs remove such a file themselves), and so is one
// naming a process of this node, which Kill leaves none of.
func (n *Node) clearStalePidFiles() {
	for _, file := range n.pidFiles() {
		pid := pidInFile(file)
		if pid <= 0 || !isAlive(pid) || n.owns(pid) {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err := os.Remove(file); err != nil {
			n.f.t.Errorf("pgformation: rejoin %s: remove stale pid file %s: %v", n.Name, file, err)
			continue
		}
		n.f.t.Logf("pgformation: rejoin %s: removed stale pid file %s: its PID %d now belongs to another process (%s)",
			n.Name, file, pid, strings.TrimSpace(string(comm)))
	}
}

// owns reports whether the live process pid is one of the node's: it runs
// in the data directory (the postmaster and its children), names it on
// its command line (pg_autoctl --pgdata, postgres -D), or has it as its
// PGDATA (pg_autoctl's services, whose titles it rewrites).
func (n *Node) owns(pid int) bool {
	proc := fmt.Sprintf("/proc/%d/", pid)
	if cwd, _ := os.Readlink(proc + "cwd"); cwd == n.PGData || strings.HasPrefix(cwd, n.PGData+"/") {
		return true
	}
	cmdline, _ := os.ReadFile(proc + "cmdline")
	for _, arg := range bytes.Split(cmdline, []byte{0}) {
		if string(arg) == n.PGData {
			return true
		}
	}
	environ, _ := os.ReadFile(proc + "environ")
	for _, v := range bytes.Split(environ, []byte{0}) {
		if string(v) == "PGDATA="+n.PGData {
			return true
		}
	}
	return false
}

// NodeState is what the monitor knows of a node.
type NodeState struct {
	Name               string
	Port               int
	Reported, Assigned string
}

// States returns the monitor's view of every node.
func (f *Formation) States(ctx context.Context) ([]NodeState, error) {
	conn, err := pgx.Connect(ctx, f.MonitorDSN())
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport, reportedstate::text, goalstate::text
		FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (NodeState, error) {
		var s NodeState
		err := row.Scan(&s.Name, &s.Port, &s.Reported, &s.Assigned)
		return s, err
	})
}

// Events returns the monitor's events since (its state changes and why,
// with each node's reported timeline), one a line, for a log or a failure
// message.
func (f *Formation) Events(ctx context.Context, since time.Time) string {
	var b strings.Builder
	err := onConn(ctx, f.MonitorDSN(), func(ctx context.Context, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT eventtime, nodename, reportedstate::text, goalstate::text,
			reportedtli, coalesce(description, '') FROM pgautofailover.event WHERE eventtime >= $1 ORDER BY eventid`, since)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var at time.Time
			var node, reported, goal, description string
			var tli int
			if err := rows.Scan(&at, &node, &reported, &goal, &tli, &description); err != nil {
				return err
			}
			fmt.Fprintf(&b, "%s %s %s/%s tli %d: %s\n", at.UTC().Format("15:04:05.000"), node, reported, goal, tli, description)
		}
		return rows.Err()
	})
	if err != nil {
		fmt.Fprintf(&b, "(monitor events: %v)\n", err)
	}
	return b.String()
}

// Primary returns the node the monitor has assigned and seen as primary,
// or nil while there is none. The monitor's view can be stale, so Primary
// confirms it on the nodes: the primary must answer as writable (not in
// recovery) and no other node may; otherwise it returns an error saying
// what it found.
func (f *Formation) Primary(ctx context.Context) (*Node, error) {
	states, err := f.States(ctx)
	if err != nil {
		return nil, err
	}
	var primary *Node
	for _, s := range states {
		if s.Reported == "primary" && s.Assigned == "primary" {
			primary = f.node(s.Port)
			break
		}
	}
	if primary == nil {
		return nil, nil
	}
	if writable, err := primary.writable(ctx); err != nil {
		return nil, fmt.Errorf("the monitor's primary %s (port %d) does not answer: %w", primary.Name, primary.Port, err)
	} else if !writable {
		return nil, fmt.Errorf("the monitor's primary %s (port %d) is in recovery", primary.Name, primary.Port)
	}
	for _, n := range f.Nodes {
		if n == primary {
			continue
		}
		if writable, err := n.writable(ctx); err == nil && writable {
			return nil, fmt.Errorf("%s (port %d) is writable too, though the monitor's primary is %s (monitor says %+v)",
				n.Name, n.Port, primary.Name, states)
		}
	}
	return primary, nil
}

// WaitPrimary waits until Primary names a primary and returns it, or the
// error Primary last gave once ctx is done. On a loaded machine the
// monitor, tuned to fail over within seconds, also fails over a primary
// that was only slow to answer its health checks: for a while after that
// there is no primary, though nothing was killed. The error it returns
// is that of the last look that finished before ctx was done: a look the
// deadline cut short (a node slow to accept a connection) says only that
// the deadline passed, and would hide what the looks before it found.
func (f *Formation) WaitPrimary(ctx context.Context) (*Node, error) {
	var last error
	for {
		primary, err := f.Primary(ctx)
		if err == nil && primary != nil {
			return primary, nil
		}
		if err == nil {
			err = errors.New("no primary")
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%v)", last, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Promoted returns a node other than old that answers, itself, as a
// primary (not in recovery), or nil while there is none: a standby
// promoted, seen before the monitor's view (which lags by seconds on a
// loaded machine) says so.
func (f *Formation) Promoted(ctx context.Context, old *Node) *Node {
	for _, n := range f.Nodes {
		if n == old {
			continue
		}
		if writable, err := n.writable(ctx); err == nil && writable {
			return n
		}
	}
	return nil
}

// writable asks the node itself whether it is a primary (not in recovery).
func (n *Node) writable(ctx context.Context) (bool, error) {
	var primary bool
	err := queryOn(ctx, n.DSN(), "SELECT NOT pg_is_in_recovery()", &primary)
	return primary, err
}

// Timeline returns the timeline the node (a primary) writes on, read from
// the name of its current WAL file; it fails on a node in recovery. A
// promotion starts a new timeline; a restart of the same primary, crash
// recovery included, does not.
func (n *Node) Timeline(ctx context.Context) (int, error) {
	var walFile string
	if err := queryOn(ctx, n.DSN(), "SELECT pg_walfile_name(pg_current_wal_lsn())", &walFile); err != nil {
		return 0, err
	}
	if len(walFile) < 8 {
		return 0, fmt.Errorf("WAL file name %q", walFile)
	}
	tl, err := strconv.ParseInt(walFile[:8], 16, 32)
	return int(tl), err
}

// TookOver checks, on a formation healthy again after its primary before
// (writing on timeline beforeTimeline) was killed and rejoined, that a
// standby took over: the primary now writes on a later timeline (another
// node; the killed one only after a second failover, which the caller's
// log shows). It returns that primary and its timeline, and an error if
// no node was promoted. pg_auto_failover restarts a primary instead of
// failing over when the monitor does not find it unhealthy (it must fail
// to connect and hear no report for node_considered_unhealthy_timeout, or
// hear PostgreSQL reported down) or no standby is a healthy candidate: the
// killed node is then primary again on its own timeline, and a test that
// counted that as a failover would have tested a restart.
func (f *Formation) TookOver(ctx context.Context, before *Node, beforeTimeline int) (*Node, int, error) {
	after, err := f.WaitPrimary(ctx)
	if err != nil {
		return nil, 0, err
	}
	tl, err := after.Timeline(ctx)
	if err != nil {
		return after, 0, fmt.Errorf("primary %s: %w", after.Name, err)
	}
	switch {
	case tl > beforeTimeline:
		// Promoted (the killed node too, if it is primary again: a
		// second failover, which the caller's log shows).
		return after, tl, nil
	case after == before:
		return after, tl, fmt.Errorf("%s is primary again on its timeline %d: it was restarted, no standby took over", after.Name, tl)
	default:
		return after, tl, fmt.Errorf("%s is primary on timeline %d, %s was on %d: no promotion", after.Name, tl, before.Name, beforeTimeline)
	}
}

// streaming returns how many standbys the node (a primary) streams to.
func (n *Node) streaming(ctx context.Context) (int, error) {
	var standbys int
	err := queryOn(ctx, n.DSN(), "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'", &standbys)
	return standbys, err
}

func (f *Formation) node(port int) *Node {
	for _, n := range f.Nodes {
		if n.Port == port {
			return n
		}
	}
	return nil
}

// WaitHealthy waits until the monitor reports one primary and every other
// node a secondary (reported and assigned), every node registered, and
// the nodes confirm it: the primary answers as writable and its
// pg_stat_replication lists every other node as a streaming standby (the
// monitor's view lags, and a standby it calls secondary may not stream
// yet). While a standby clones or catches up it asks the primary for a
// CHECKPOINT every second: pg_basebackup otherwise waits for a spread
// checkpoint that can take minutes.
func (f *Formation) WaitHealthy(ctx context.Context) error {
	want := map[string]int{"primary": 1, "secondary": len(f.Nodes) - 1}
	return f.waitStates(ctx, want, func(states []NodeState) error {
		var primary *Node
		for _, s := range states {
			if s.Reported == "primary" {
				primary = f.node(s.Port)
			}
		}
		if primary == nil {
			return errors.New("the monitor's primary is not a node of this formation")
		}
		if writable, err := primary.writable(ctx); err != nil || !writable {
			return fmt.Errorf("primary %s: writable %v (%v)", primary.Name, writable, err)
		}
		standbys, err := primary.streaming(ctx)
		if err != nil || standbys != len(f.Nodes)-1 {
			return fmt.Errorf("primary %s streams to %d standbys (%v), want %d", primary.Name, standbys, err, len(f.Nodes)-1)
		}
		return nil
	})
}

// waitStates waits until the monitor's view counts want (reported and
// assigned) and then confirm, if not nil, accepts it. It returns at once,
// with the node's output, when a node's pg_autoctl has exited (it refused
// to start, or gave up): the formation cannot heal without it.
func (f *Formation) waitStates(ctx context.Context, want map[string]int, confirm func([]NodeState) error) error {
	var last []NodeState
	var lastErr error
	checkpoint := time.Now()
	for {
		if n, state := f.exited(); n != nil {
			return fmt.Errorf("%s's pg_autoctl exited (%s):\n%s", n.Name, state, n.output())
		}
		states, err := f.States(ctx)
		if err == nil {
			last = states
			got := map[string]int{}
			cloning := false
			for _, s := range states {
				if s.Reported == s.Assigned {
					got[s.Reported]++
				}
				if s.Reported == "wait_standby" || s.Reported == "catchingup" || s.Assigned == "catchingup" {
					cloning = true
				}
			}
			done := true
			for state, n := range want {
				if got[state] != n {
					done = false
				}
			}
			if done && confirm != nil {
				if err := confirm(states); err != nil {
					lastErr = err
					done = false
				}
			}
			if done {
				return nil
			}
			if cloning && time.Since(checkpoint) > time.Second {
				checkpoint = time.Now()
				for _, s := range states {
					if s.Reported == "primary" || s.Reported == "wait_primary" || s.Reported == "single" {
						if n := f.node(s.Port); n != nil {
							execOn(ctx, n.DSN(), "CHECKPOINT")
						}
					}
				}
			}
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("want %v, monitor says %+v (last error: %v): %w", want, last, lastErr, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (f *Formation) waitMonitor(ctx context.Context) error {
	for {
		conn, err := pgx.Connect(ctx, f.MonitorDSN())
		if err == nil {
			var n int
			err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_extension WHERE extname = 'pgautofailover'`).Scan(&n)
			conn.Close(ctx)
			if err == nil && n == 1 {
				for name, value := range MonitorSettings {
					if err := f.monitorExec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = %s", name, value)); err != nil {
						return err
					}
				}
				return f.monitorExec(ctx, "SELECT pg_reload_conf()")
			}
		}
		select {
		case <-f.monitor.done:
			return errors.New("pg_autoctl create monitor exited")
		case <-ctx.Done():
			return fmt.Errorf("%w (last error %v)", ctx.Err(), err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (f *Formation) monitorExec(ctx context.Context, sql string) error {
	return execOn(ctx, f.MonitorDSN(), sql)
}

// onConn runs f on a connection of its own to dsn, all within 10 s: a
// node being killed or promoted must not hang the harness.
func onConn(ctx context.Context, dsn string, f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(ctx, conn)
}

func queryOn(ctx context.Context, dsn, sql string, dest ...any) error {
	return onConn(ctx, dsn, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, sql).Scan(dest...)
	})
}

func execOn(ctx context.Context, dsn, sql string) error {
	return onConn(ctx, dsn, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql)
		return err
	})
}

// killTrees SIGSTOPs the roots and all their descendants (so none can
// fork or restart another while the trees are collected), then SIGKILLs
// them all and waits until each is gone. It returns how many processes it
// killed and those still alive after 30 s.
func (f *Formation) killTrees(roots ...int) (killed int, survivors []int) {
	stopped := map[int]bool{}
	for {
		grew := false
		for _, root := range roots {
			for _, pid := range descendants(root) {
				if !stopped[pid] {
					syscall.Kill(pid, syscall.SIGSTOP)
					stopped[pid] = true
					grew = true
				}
			}
		}
		if !grew {
			break
		}
	}
	for pid := range stopped {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(stopped), waitGone(stopped)
}

// waitGone waits (up to 30 s) until no pid of the set is alive; a zombie
// counts as gone (its parent reaps it). It returns the pids still alive.
func waitGone(pids map[int]bool) []int {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var alive []int
		for pid := range pids {
			if isAlive(pid) {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// postmasterPID returns the pid the data directory's postmaster.pid
// names, or 0.
func postmasterPID(pgdata string) int {
	return pidInFile(filepath.Join(pgdata, "postmaster.pid"))
}

// pidInFile returns the pid on the first line of a pid file (PostgreSQL's
// or pg_autoctl's), or 0.
func pidInFile(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0
	}
	return pid
}

// processesIn returns the live processes running in dir: those whose
// working directory is dir or below it (a postmaster moves into its data
// directory and its children inherit it), and the postmaster its
// postmaster.pid names if that process names dir on its command line (a
// stale pid file's number may belong to someone else's process by now).
func (f *Formation) processesIn(dir string) []int {
	found := map[int]bool{}
	if pid := postmasterPID(dir); pid > 0 && isAlive(pid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmdline, []byte(dir)) {
			found[pid] = true
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cwd, _ := os.Readlink("/proc/" + e.Name() + "/cwd")
		if (cwd == dir || strings.HasPrefix(cwd, dir+"/")) && isAlive(pid) {
			found[pid] = true
		}
	}
	var pids []int
	for pid := range found {
		pids = append(pids, pid)
	}
	return pids
}

// descendsFrom reports whether root is pid or one of its ancestors.
func descendsFrom(pid, root int) bool {
	for i := 0; pid > 1 && i < 64; i++ {
		if pid == root {
			return true
		}
		pid = parentPID(pid)
	}
	return false
}

// parentPID returns pid's parent, or 0.
func parentPID(pid int) int {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

func isAlive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// descendants returns root and every live process below it, read from
// /proc.
func descendants(root int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		children[ppid] = append(children[ppid], pid)
	}
	var out []int
	if isAlive(root) {
		out = append(out, root)
	}
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// teardown kills every process tree the formation started, then any
// process still running out of its directory (a postmaster whose
// supervisor died first), waits for them, and removes the directory.
func (f *Formation) teardown() {
	for _, n := range f.Nodes {
		if _, err := n.kill(); err != nil {
			f.t.Errorf("pgformation teardown: kill %s: %v", n.Name, err)
		}
	}
	if f.monitor != nil {
		f.killTrees(f.monitor.cmd.Process.Pid)
		<-f.monitor.done
	}
	// Every process the formation started runs in its directory (spawn
	// sets it as the working directory; postgres moves into its data
	// directory below it), is a postmaster its pid file names, or names
	// the directory on its command line.
	leftover := f.processesIn(f.dir)
	pidFiles, _ := filepath.Glob(filepath.Join(f.dir, "*", "postmaster.pid"))
	for _, file := range pidFiles {
		leftover = append(leftover, f.processesIn(filepath.Dir(file))...)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(cmdline, []byte(f.dir)) {
			leftover = append(leftover, pid)
		}
	}
	if len(leftover) > 0 {
		if _, survivors := f.killTrees(leftover...); len(survivors) > 0 {
			f.t.Errorf("pgformation teardown: processes %v still alive 30 s after SIGKILL", survivors)
		}
	}
	if err := os.RemoveAll(f.dir); err != nil {
		f.t.Errorf("remove formation directory: %v", err)
	}
}
