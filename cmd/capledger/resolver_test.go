package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/replicatest"
)

// jobLine is one line of the executor: "job RES OP TOKENS" (the job is in
// its durable log), "hang RES OP" (it hangs before calling the work),
// "recovered RES OP TOKENS" (a later run finished it from the log),
// "recovery done N".
var jobLine = regexp.MustCompile(`^(job|hang|recovered) (\S+) (\S+)(?: (\d+))?$`)

// executorProcess is one run of the executor; its lines accumulate in
// the shared jobs table.
type executorProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// jobTable is what the executor said, across its runs.
type jobTable struct {
	mu        sync.Mutex
	tokens    map[string]int64 // reservation id -> tokens, of "job" lines
	hung      []string         // reservation ids of "hang" lines
	recovered int
	jobs      int
	recovery  int // "recovery done" lines
	logs      strings.Builder
}

func (j *jobTable) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		j.mu.Lock()
		j.logs.WriteString(line + "\n")
		if m := jobLine.FindStringSubmatch(line); m != nil {
			switch m[1] {
			case "job":
				n, _ := strconv.ParseInt(m[4], 10, 64)
				j.tokens[m[2]] = n
				j.jobs++
			case "hang":
				j.hung = append(j.hung, m[2])
			case "recovered":
				// A kill -9 between the job's durable log entry and its
				// "job" line leaves a job only its recovery reports: the
				// truth of what was used is the log, not the lines.
				n, _ := strconv.ParseInt(m[4], 10, 64)
				if _, ok := j.tokens[m[2]]; !ok && !slices.Contains(j.hung, m[2]) {
					j.tokens[m[2]] = n
				}
				j.recovered++
			}
		}
		if strings.HasPrefix(line, "recovery done") {
			j.recovery++
		}
		j.mu.Unlock()
	}
}

func (j *jobTable) read(f func(j *jobTable)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	f(j)
}

func startExecutor(t testing.TB, bin string, table *jobTable, args ...string) *executorProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	childproc.DieWithParent(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &executorProcess{cmd: cmd, done: make(chan struct{})}
	go func() { table.scan(out); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	return p
}

// kill is kill -9.
func (p *executorProcess) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
		<-p.done
		p.cmd.Wait()
	}
}

// waitUntil polls cond every 50 ms until it holds, failing after limit
// with what describe says (a bound on waiting, not a timing assertion).
func waitUntil(t testing.TB, limit time.Duration, describe func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v: %s", limit, describe())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// resolverRig is a real capledger serve with a resolver config pointing
// at a real executor's address, and the route's policy published.
type resolverRig struct {
	srv      *serverProcess
	rpc      capledgerv1connect.LedgerServiceClient
	execAddr string
	execArgs []string
}

func newResolverRig(t *testing.T, bin, dir string, resolver string, execLimit time.Duration, serveArgs ...string) *resolverRig {
	t.Helper()
	secretPath := filepath.Join(dir, "route.secret")
	if err := os.WriteFile(secretPath, []byte("s3cret-of-the-jobs-route\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	execAddr := replicatest.FreeAddr(t)
	cfg := fmt.Sprintf(`{%s "routes": {"jobs.run": {"statusUrl": "http://%s", "secretFile": "route.secret", "unknownDeadline": "10m"}}}`, resolver, execAddr)
	cfgPath := filepath.Join(dir, "resolver.json")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, bin, filepath.Join(dir, "data"), append([]string{"--resolver-config", cfgPath}, serveArgs...)...)
	rpc := capledgerv1connect.NewLedgerServiceClient(http.DefaultClient, srv.url)
	ctx := context.Background()
	_, err := rpc.PublishPolicy(ctx, connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-1", Route: "jobs.run",
		Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: 1 << 40}, {Unit: "requests", Burst: 1 << 40}},
		HoldTtl:    durationpb.New(3 * time.Second), ExecutionLimit: durationpb.New(execLimit),
	}}))
	if err != nil {
		t.Fatal(err)
	}
	return &resolverRig{srv: srv, rpc: rpc, execAddr: execAddr, execArgs: []string{
		"--ledger", srv.url, "--listen", execAddr, "--dir", filepath.Join(dir, "executor"), "--secret-file", secretPath, "--route", "jobs.run",
	}}
}

func (r *resolverRig) balances(t testing.TB) (reserved, spent int64) {
	t.Helper()
	resp, err := r.rpc.GetAccount(context.Background(), connect.NewRequest(&v1.GetAccountRequest{Subject: "tenant-1", Route: "jobs.run"}))
	if err != nil || len(resp.Msg.GetAccounts()) != 1 {
		t.Fatalf("account: %v %v", err, resp)
	}
	for _, b := range resp.Msg.GetAccounts()[0].GetBalances() {
		if b.GetUnit() == "tokens" {
			return b.GetReserved(), b.GetSpent()
		}
	}
	t.Fatal("no tokens balance")
	return 0, 0
}

func (r *resolverRig) backlog(t testing.TB) int64 {
	t.Helper()
	resp, err := r.rpc.ListUsageUnknown(context.Background(), connect.NewRequest(&v1.ListUsageUnknownRequest{PageSize: 1}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetBacklog()
}

// unknownAges returns, for every reservation of ids that was ever
// USAGE_UNKNOWN and is settled now, how long it waited (usageUnknownAt to
// finishedAt); it fails the test for one that is not settled with its
// job's tokens.
func (r *resolverRig) checkSettled(t testing.TB, want map[string]int64) (ages []time.Duration) {
	t.Helper()
	for id, tokens := range want {
		resp, err := r.rpc.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{ReservationId: id}))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		res := resp.Msg.GetReservation()
		settled := res.GetState() == v1.ReservationState_RESERVATION_STATE_SETTLED || res.GetState() == v1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT
		if !settled || res.GetActualUnits()["tokens"] != tokens {
			t.Errorf("%s: %s with %d tokens, want settled with %d", id, res.GetState(), res.GetActualUnits()["tokens"], tokens)
		}
		if res.GetUsageUnknownAt() != nil && res.GetFinishedAt() != nil {
			ages = append(ages, res.GetFinishedAt().AsTime().Sub(res.GetUsageUnknownAt().AsTime()))
		}
	}
	return ages
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func metricValue(t testing.TB, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return -1
}

// TestResolverSettlesWorkOfKilledExecutors is the resolver's gate on real
// processes: a real `capledger serve` with --resolver-config and a real
// executor that is kill -9'd twice with jobs in flight (and once hung
// between Start and its work), then restarted. Every USAGE_UNKNOWN
// reservation must settle through the resolver, with the job's own
// tokens (zero for the work never called), each charged once, and the
// audit clean.
func TestResolverSettlesWorkOfKilledExecutors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs capledger and an executor")
	}
	bin, exe := buildBinaries(t)
	dir := t.TempDir()
	rig := newResolverRig(t, bin, dir, `"interval": "200ms", "minBackoff": "200ms", "maxBackoff": "1s", "timeout": "1s",`, 2*time.Second)
	table := &jobTable{tokens: map[string]int64{}}
	describe := func() string {
		var s string
		table.read(func(j *jobTable) { s = j.logs.String() })
		return fmt.Sprintf("executor said:\n%s\nserver logs:\n%s", s, rig.srv.logs.String())
	}
	jobs := func() (n int) { table.read(func(j *jobTable) { n = j.jobs }); return }

	// Run 1: six workers, the third job hangs before its work is called;
	// killed once ten jobs have started.
	run := startExecutor(t, exe, table, append(rig.execArgs, "--workers", "6", "--job-duration", "1500ms", "--hang-at", "3")...)
	waitUntil(t, 30*time.Second, describe, func() bool { return jobs() >= 10 })
	run.kill()
	// The execution limit passes while the executor is down: the ledger
	// marks its work USAGE_UNKNOWN and the resolver finds nobody to ask.
	waitUntil(t, 30*time.Second, describe, func() bool { return rig.backlog(t) > 0 })
	time.Sleep(time.Second)
	if reserved, _ := rig.balances(t); reserved == 0 {
		t.Fatalf("nothing held while the executor is down")
	}

	// Run 2: it recovers run 1's jobs, works on, and is killed again.
	run = startExecutor(t, exe, table, append(rig.execArgs, "--workers", "6", "--job-duration", "1500ms")...)
	before := jobs()
	waitUntil(t, 30*time.Second, describe, func() bool { return jobs() >= before+8 })
	run.kill()
	time.Sleep(2500 * time.Millisecond)

	// Run 3 only recovers and answers the resolver; its recovery lines
	// are part of the truth, so wait for all three runs' "recovery done".
	startExecutor(t, exe, table, rig.execArgs...)
	recoveries := func() (n int) { table.read(func(j *jobTable) { n = j.recovery }); return }
	waitUntil(t, 45*time.Second, describe, func() bool {
		reserved, _ := rig.balances(t)
		return recoveries() == 3 && reserved == 0 && rig.backlog(t) == 0
	})

	var want map[string]int64
	var hung []string
	var recovered int
	table.read(func(j *jobTable) { want, hung, recovered = copyUnits(j.tokens), slices.Clone(j.hung), j.recovered })
	if len(hung) != 1 || recovered == 0 {
		t.Fatalf("hung %v, recovered %d: the crashes did not leave work behind\n%s", hung, recovered, describe())
	}
	var sum int64
	for _, n := range want {
		sum += n
	}
	if _, spent := rig.balances(t); spent != sum {
		t.Errorf("spent %d tokens, the executor's jobs used %d: charged other than once", spent, sum)
	}
	ages := rig.checkSettled(t, want)
	// The work never called settles as zero, by the signed never-started answer.
	for id, n := range rig.checkSettledMap(t, hung) {
		if n != 0 {
			t.Errorf("hung %s settled with %d tokens, want 0", id, n)
		}
	}
	if got := metricValue(t, rig.srv.url, `capledger_resolver_settled_total{answer="never_started"}`); got < 1 {
		t.Errorf("never-started settles %v, want at least 1", got)
	}
	finished := metricValue(t, rig.srv.url, `capledger_resolver_settled_total{answer="finished"}`)
	if finished < float64(recovered) {
		t.Errorf("the resolver settled %v finished operations, the executor recovered %d", finished, recovered)
	}
	if status, audit := post(http.DefaultClient, rig.srv.url, "Audit", `{}`); status != 200 || audit["discrepancies"] != nil {
		t.Fatalf("audit: %d %v", status, audit)
	}
	t.Logf("%d jobs, %d recovered after kill -9, %d were USAGE_UNKNOWN: age p50 %v, p99 %v, max %v",
		len(want), recovered, len(ages), quantile(ages, 0.5), quantile(ages, 0.99), quantile(ages, 1))
}

// checkSettledMap returns the settled tokens of each id, failing for one
// that is not settled.
func (r *resolverRig) checkSettledMap(t testing.TB, ids []string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, id := range ids {
		resp, err := r.rpc.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{ReservationId: id}))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		res := resp.Msg.GetReservation()
		if res.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED {
			t.Errorf("%s: %s, want SETTLED", id, res.GetState())
		}
		out[id] = res.GetActualUnits()["tokens"]
	}
	return out
}

func copyUnits(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestResolverSoak reports the USAGE_UNKNOWN age p99 on real processes:
// serve with the resolver's default timing, and an executor that is
// kill -9'd every CAPLEDGER_SOAK_CRASH_EVERY (default 10s) with 8 jobs of
// 1 s in flight and restarted CAPLEDGER_SOAK_DOWN later (default 5s),
// for CAPLEDGER_RESOLVER_SOAK (a duration; the test is skipped without
// it). The execution limit is 3 s. Every job must end settled with its
// own tokens, charged once, audit clean.
//
//	CAPLEDGER_RESOLVER_SOAK=3m go test ./cmd/capledger -run TestResolverSoak -v
func TestResolverSoak(t *testing.T) {
	soak, err := time.ParseDuration(os.Getenv("CAPLEDGER_RESOLVER_SOAK"))
	if err != nil {
		t.Skip("set CAPLEDGER_RESOLVER_SOAK=3m to run the resolver soak")
	}
	envDuration := func(name string, def time.Duration) time.Duration {
		if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
			return d
		}
		return def
	}
	crashEvery, down := envDuration("CAPLEDGER_SOAK_CRASH_EVERY", 10*time.Second), envDuration("CAPLEDGER_SOAK_DOWN", 5*time.Second)
	bin, exe := buildBinaries(t)
	dir := t.TempDir()
	rig := newResolverRig(t, bin, dir, "", 3*time.Second, "--log-level", "debug")
	table := &jobTable{tokens: map[string]int64{}}
	describe := func() string { return rig.srv.logs.String() }
	end := time.Now().Add(soak)
	crashes := 0
	var timeline []string
	for time.Now().Before(end) {
		timeline = append(timeline, "start "+time.Now().UTC().Format("15:04:05.000"))
		run := startExecutor(t, exe, table, append(rig.execArgs, "--workers", "8", "--job-duration", "1s")...)
		time.Sleep(crashEvery)
		run.kill()
		timeline = append(timeline, "kill "+time.Now().UTC().Format("15:04:05.000"))
		crashes++
		time.Sleep(down)
	}
	timeline = append(timeline, "final start "+time.Now().UTC().Format("15:04:05.000"))
	startExecutor(t, exe, table, rig.execArgs...)
	waitUntil(t, 5*time.Minute, describe, func() bool {
		reserved, _ := rig.balances(t)
		return reserved == 0 && rig.backlog(t) == 0
	})
	var want map[string]int64
	table.read(func(j *jobTable) { want = copyUnits(j.tokens) })
	var sum int64
	for _, n := range want {
		sum += n
	}
	if _, spent := rig.balances(t); spent != sum {
		t.Errorf("spent %d tokens, the jobs used %d", spent, sum)
	}
	ages := rig.checkSettled(t, want)
	if status, audit := post(http.DefaultClient, rig.srv.url, "Audit", `{}`); status != 200 || audit["discrepancies"] != nil {
		t.Fatalf("audit: %d %v", status, audit)
	}
	if os.Getenv("CAPLEDGER_SOAK_EXPLAIN") != "" {
		rig.explainOldest(t, want, timeline, table)
	}
	t.Logf("soak %v: %d crashes (every %v, down %v), %d jobs, %d USAGE_UNKNOWN: age p50 %v, p99 %v, max %v",
		soak, crashes, crashEvery, down, len(want), len(ages), quantile(ages, 0.5).Round(time.Millisecond),
		quantile(ages, 0.99).Round(time.Millisecond), quantile(ages, 1).Round(time.Millisecond))
}

// explainOldest logs the three longest-waiting reservations' times, the
// server's and the executor's lines about them, and the crash timeline.
func (r *resolverRig) explainOldest(t *testing.T, want map[string]int64, timeline []string, table *jobTable) {
	type aged struct {
		id  string
		age time.Duration
		res *v1.Reservation
	}
	var all []aged
	for id := range want {
		resp, err := r.rpc.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{ReservationId: id}))
		if err != nil {
			t.Fatal(err)
		}
		res := resp.Msg.GetReservation()
		if res.GetUsageUnknownAt() != nil {
			all = append(all, aged{id, res.GetFinishedAt().AsTime().Sub(res.GetUsageUnknownAt().AsTime()), res})
		}
	}
	slices.SortFunc(all, func(a, b aged) int { return int(b.age - a.age) })
	t.Logf("timeline: %s", strings.Join(timeline, ", "))
	var execLogs string
	table.read(func(j *jobTable) { execLogs = j.logs.String() })
	for _, a := range all[:min(3, len(all))] {
		t.Logf("%s age %v: started %s marked %s settled %s op %s", a.id, a.age, a.res.GetStartedAt().AsTime().Format("15:04:05.000"),
			a.res.GetUsageUnknownAt().AsTime().Format("15:04:05.000"), a.res.GetFinishedAt().AsTime().Format("15:04:05.000"), a.res.GetOperationId())
		for _, line := range strings.Split(r.srv.logs.String()+execLogs, "\n") {
			if strings.Contains(line, a.id) {
				t.Logf("  %s", line)
			}
		}
	}
}
