package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// commandCounts scrapes capledger_commands_total from /metrics, over the
// server's socket, by "kind/outcome".
func (h *harness) commandCounts() map[string]float64 {
	return h.kindOutcomeCounts("capledger_commands_total")
}

// kindOutcomeCounts scrapes metric, a counter by kind and outcome, from
// /metrics, over the server's socket, by "kind/outcome".
func (h *harness) kindOutcomeCounts(metric string) map[string]float64 {
	h.t.Helper()
	counts := map[string]float64{}
	for _, line := range strings.Split(h.get("/metrics"), "\n") {
		rest, ok := strings.CutPrefix(line, metric+`{kind="`)
		if !ok {
			continue
		}
		kind, rest, _ := strings.Cut(rest, `",outcome="`)
		outcome, value, _ := strings.Cut(rest, `"} `)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			h.t.Fatalf("metrics line %q: %v", line, err)
		}
		counts[kind+"/"+outcome] = v
	}
	return counts
}

// wantCounted fails unless capledger_commands_total grew from before by
// exactly want (kind/outcome -> delta), and by nothing else.
func (h *harness) wantCounted(before map[string]float64, want map[string]float64) {
	h.t.Helper()
	h.wantGrown("capledger_commands_total", before, want)
}

// wantGrown is wantCounted of metric (see kindOutcomeCounts).
func (h *harness) wantGrown(metric string, before map[string]float64, want map[string]float64) {
	h.t.Helper()
	after := h.kindOutcomeCounts(metric)
	got := map[string]float64{}
	for key, v := range after {
		if d := v - before[key]; d != 0 {
			got[key] = d
		}
	}
	if !maps.Equal(got, want) {
		h.t.Errorf("%s grew by %v, want %v", metric, sorted(got), sorted(want))
	}
}

func sorted(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s +%g", k, m[k]))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// publishElsewhere publishes policy through another server (replica) on
// the harness's engine, so that the harness's server still maps by the
// generation its cache holds.
func (h *harness) publishElsewhere(policy string, generation int64) {
	h.t.Helper()
	other := serve(h.t, server.New(h.engine, server.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	req, _ := http.NewRequest(http.MethodPost, other+"/capledger.v1.LedgerService/PublishPolicy", strings.NewReader(policy))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != 200 || num(field(r.body, "policy", "generation")) != generation {
		h.t.Fatalf("publish on the other replica: %d %s", r.status, r.raw)
	}
}

// The dimensions of tokensPolicy in the other order: a reserve mapped by
// one is stale under the other.
const tokensPolicySwapped = `{"policy":{"subject":"tenant-7","route":"chat.generate",
  "dimensions":[{"unit":"requests","burst":"10","refillUnits":"1","refillInterval":"1s"},
                {"unit":"tokens","burst":"1000","refillUnits":"100","refillInterval":"1s","maxReservation":"900"}],
  "holdTtl":"30s"}}`

// A command the ledger refused as stale (mapped by a generation that no
// longer decides) is mapped again and sent again; the client sees only
// the second answer, and capledger_commands_total counts only that one.
// Reserve, RecordUsage and ReserveBatch counted the stale refusal too,
// as invalid_command, beside the answer.
func TestStaleCommandCountsOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("warm", 10), "") // caches generation 1

	h.publishElsewhere(tokensPolicySwapped, 2)
	before := h.commandCounts()
	if res := h.ok("Reserve", reserveBody("after", 7), ""); num(field(res, "reservation", "policyGeneration")) != 2 {
		t.Fatalf("reserve after the switch: %v", res)
	}
	h.wantCounted(before, map[string]float64{"reserve/ok": 1})

	h.publishElsewhere(tokensPolicy, 3)
	before = h.commandCounts()
	h.ok("RecordUsage", `{"reservationId":"rec","operationId":"op-1","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":7,"requests":1}}`, "")
	h.wantCounted(before, map[string]float64{"record/ok": 1})

	h.publishElsewhere(tokensPolicySwapped, 4)
	before = h.commandCounts()
	r := h.ok("ReserveBatch", `{"requests":[`+reserveBody("b-1", 5)+`,`+reserveBody("b-2", 5)+`]}`, "")
	for i, out := range r["outcomes"].([]any) {
		if num(field(out.(map[string]any), "ok", "reservation", "policyGeneration")) != 4 {
			t.Fatalf("batch item %d after the switch: %v", i, r)
		}
	}
	h.wantCounted(before, map[string]float64{"reserve/ok": 2})
}

// A batch that fails whole (here: the store cannot commit) answers 503,
// and every item counts once as unavailable, those refused before the
// ledger too: the client saw no item's answer, and retries them all.
func TestWholeFailedBatchCountsEachItemUnavailable(t *testing.T) {
	h := newHarness(t, harnessOptions{faults: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("held-1", 10), "")
	h.ok("Reserve", reserveBody("held-2", 10), "")
	h.ok("Start", `{"reservationId":"held-1","operationId":"op-1"}`, "")
	h.ok("Start", `{"reservationId":"held-2","operationId":"op-2"}`, "")
	h.faults.FailCommits(fmt.Errorf("disk gone: %w", store.ErrUnavailable))
	defer h.faults.FailCommits(nil)

	before := h.commandCounts()
	r := h.call("ReserveBatch", `{"requests":[`+reserveBody("b-1", 5)+`,`+reserveBody("b-2", 5)+`,`+reserveBody("", 5)+`]}`, "")
	h.wantError(r, 503, "unavailable", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 3})

	before = h.commandCounts()
	r = h.call("SettleBatch", `{"requests":[
	  {"reservationId":"held-1","operationId":"op-1","actualUnits":{"tokens":5,"requests":1}},
	  {"reservationId":"held-2","operationId":"op-2","actualUnits":{"tokens":5,"requests":1}},
	  {"reservationId":"held-2","actualUnits":{"tokens":5,"requests":1}}]}`, "")
	h.wantError(r, 503, "unavailable", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"settle/unavailable": 3})
}

// unreadableStore's failure, as a single Settle and a SettleBatch meet
// it: both answer 503, and both count it under the one label of a store
// that could not answer, unavailable (a single Settle counted it as
// store_unavailable, a SettleBatch's items not at all).
func TestUnreadableReservationCountsUnavailable(t *testing.T) {
	var unreadable *unreadableStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		unreadable = &unreadableStore{Store: st}
		return unreadable
	}})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("gone", 10), "")
	h.ok("Reserve", reserveBody("here", 10), "")
	h.ok("Start", `{"reservationId":"gone","operationId":"op-1"}`, "")
	h.ok("Start", `{"reservationId":"here","operationId":"op-2"}`, "")
	unreadable.mu.Lock()
	unreadable.id = "gone"
	unreadable.mu.Unlock()

	settleGone := `{"reservationId":"gone","operationId":"op-1","actualUnits":{"tokens":5,"requests":1}}`
	before := h.commandCounts()
	h.wantError(h.call("Settle", settleGone, ""), 503, "unavailable", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"settle/unavailable": 1})

	before = h.commandCounts()
	r := h.call("SettleBatch", `{"requests":[{"reservationId":"here","operationId":"op-2","actualUnits":{"tokens":5,"requests":1}},`+settleGone+`]}`, "")
	h.wantError(r, 503, "unavailable", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"settle/unavailable": 2})
}

// slowStore answers the reads of one reservation id only when the
// caller's context ends, with its error, as a store read that outlives
// the request's deadline does.
type slowStore struct {
	store.Store
	mu sync.Mutex
	id string
}

func (s *slowStore) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	s.mu.Lock()
	slow := id == s.id
	s.mu.Unlock()
	if slow {
		<-ctx.Done()
		return ledger.Reservation{}, fmt.Errorf("reservation %s: %w", id, ctx.Err())
	}
	return s.Store.ReservationGet(ctx, id)
}

// A batch item's read that outlives the request's deadline fails the
// whole batch with the status a single call gets for it, 504
// deadline_exceeded, counted as unavailable per item: it answered 200
// with the item's error (a SettleBatch whose every item timed out, a
// ReserveBatch whose retried item's id could not be read), so a client
// took an answer for a batch it had given up on.
func TestBatchReadPastDeadlineFailsTheCall(t *testing.T) {
	var slow *slowStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		slow = &slowStore{Store: st}
		return slow
	}})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("slow", 10), "")
	h.ok("Start", `{"reservationId":"slow","operationId":"op-1"}`, "")
	slow.mu.Lock()
	slow.id = "slow"
	slow.mu.Unlock()
	withDeadline := func(method, body string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Connect-Timeout-Ms", "200")
		return h.do(req)
	}
	settleSlow := `{"reservationId":"slow","operationId":"op-1","actualUnits":{"tokens":5,"requests":1}}`

	before := h.commandCounts()
	h.wantError(withDeadline("Settle", settleSlow), 504, "deadline_exceeded", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"settle/unavailable": 1})

	before = h.commandCounts()
	h.wantError(withDeadline("SettleBatch", `{"requests":[`+settleSlow+`]}`), 504, "deadline_exceeded", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"settle/unavailable": 1})

	// A retry of "slow" with a unit the policy lacks: the server reads the
	// id to let the ledger answer it.
	retry := `{"reservationId":"slow","subject":"tenant-7","route":"chat.generate","units":{"tokens":10,"images":1}}`
	before = h.commandCounts()
	h.wantError(withDeadline("ReserveBatch", `{"requests":[`+reserveBody("fresh", 5)+`,`+retry+`]}`), 504, "deadline_exceeded", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 2})
	if got := h.call("GetReservation", `{"reservationId":"fresh"}`, ""); got.status != 404 {
		t.Fatalf("an item of the failed batch was admitted: %s", got.raw)
	}
}

// An IssueShard the ledger refused as stale is mapped again and issued;
// capledger_shard_commands_total counts the issue once. It counted the
// stale refusal too, as invalid_command.
func TestStaleShardIssueCountsOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	emergency := strings.Replace(tokensPolicy, `"holdTtl"`, `"emergencyMode":true,"holdTtl"`, 1)
	h.ok("PublishPolicy", emergency, "") // caches generation 1
	h.publishElsewhere(strings.Replace(tokensPolicySwapped, `"holdTtl"`, `"emergencyMode":true,"holdTtl"`, 1), 2)

	const metric = "capledger_shard_commands_total"
	before := h.kindOutcomeCounts(metric)
	req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/IssueShard", strings.NewReader(
		`{"shardId":"sh-1","subject":"tenant-7","route":"chat.generate","units":{"tokens":100,"requests":2},"gatewayId":"gw-1","bootEpoch":"1","ttl":"600s"}`))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != 200 || num(field(r.body, "shard", "policyGeneration")) != 2 {
		t.Fatalf("issue after the switch: %d %s", r.status, r.raw)
	}
	h.wantGrown(metric, before, map[string]float64{"shard_issue/ok": 1})
}

// policyUnreadableStore fails every PolicyGet while failing is set, as a
// store that went away after a commit does for the read that renders the
// answer.
type policyUnreadableStore struct {
	store.Store
	mu      sync.Mutex
	failing bool
}

func (s *policyUnreadableStore) PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error) {
	s.mu.Lock()
	failing := s.failing
	s.mu.Unlock()
	if failing {
		return ledger.Policy{}, fmt.Errorf("policy %d: %w", generation, store.ErrUnavailable)
	}
	return s.Store.PolicyGet(ctx, generation)
}

// A Start or Release the ledger applied, but whose answer could not be
// built (a replica whose policy cache is cold cannot read the policy to
// render the reservation), answers 503 "applied": capledger_commands_total
// counts it as the caller saw it, unavailable, as it counts a Reserve or
// Settle so. It counted them ok.
func TestAppliedButUnrenderedCountsUnavailable(t *testing.T) {
	var unreadable *policyUnreadableStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		unreadable = &policyUnreadableStore{Store: st}
		return unreadable
	}})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("r-1", 10), "")
	h.ok("Reserve", reserveBody("r-2", 10), "")

	// Another replica, started now: its policy cache is empty.
	metrics := server.NewMetrics()
	other := serve(t, server.New(h.engine, server.Config{Metrics: metrics, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	unreadable.mu.Lock()
	unreadable.failing = true
	unreadable.mu.Unlock()
	for _, call := range []struct{ method, body string }{
		{"Start", `{"reservationId":"r-1","operationId":"op-1"}`},
		{"Release", `{"reservationId":"r-2"}`},
	} {
		req, _ := http.NewRequest(http.MethodPost, other+"/capledger.v1.LedgerService/"+call.method, strings.NewReader(call.body))
		req.Header.Set("Content-Type", "application/json")
		r := h.do(req)
		h.wantError(r, 503, "unavailable", server.ReasonStoreUnavailable)
		if !strings.Contains(string(r.raw), "applied (committed)") {
			t.Fatalf("%s: want an applied command's 503, got %s", call.method, r.raw)
		}
	}
	resp, err := http.Get(other + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	got := grep(string(body), "capledger_commands_total{")
	want := "capledger_commands_total{kind=\"release\",outcome=\"unavailable\"} 1\ncapledger_commands_total{kind=\"start\",outcome=\"unavailable\"} 1"
	if got != want {
		t.Errorf("the other replica's capledger_commands_total:\n%s\nwant:\n%s", got, want)
	}
}

// Generation 0 names no policy: RollbackPolicy, RollbackGenerations and
// DrainProgress all answer it 400 INVALID_COMMAND naming the field (the
// two lists answered it 404 POLICY_NOT_FOUND), before any generation is
// read or rolled back.
func TestGenerationZeroIsInvalidEverywhere(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	for _, c := range []struct{ service, method, body, field string }{
		{"LedgerService", "RollbackPolicy", `{"generation":"0"}`, "generation:"},
		{"LedgerService", "RollbackPolicy", `{}`, "generation:"},
		{"LedgerService", "GetPolicy", `{}`, "generation:"},
		{"RolloutService", "RollbackGenerations", `{"generations":["1","0"]}`, "generations[1]:"},
		{"RolloutService", "DrainProgress", `{"generations":["0"]}`, "generations[0]:"},
	} {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+c.service+"/"+c.method, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		r := h.do(req)
		if r.status != http.StatusBadRequest || r.body["code"] != "invalid_argument" ||
			!strings.Contains(fmt.Sprint(r.body["message"]), c.field+" 0 names no policy generation") {
			t.Errorf("%s %s: %d %s", c.method, c.body, r.status, r.raw)
		}
	}
	if p := h.ok("GetPolicy", `{"generation":"1"}`, ""); field(p, "policy", "rolledBack") != nil {
		t.Errorf("generation 1 was rolled back beside a refused 0: %v", p)
	}
}

// RollbackPolicy and RollbackGenerations count what their caller saw,
// once: a refusal before the ledger (generation 0, an unknown generation)
// once under its reason, which RollbackGenerations did not count at all;
// a success each generation under its outcome.
func TestRollbacksCountTheirAnswerOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-8","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"10"}]}}`, "")
	rollouts := func(method, body string, status int) {
		t.Helper()
		if r := h.rollout(method, body, ""); r.status != status {
			t.Fatalf("%s %s: %d %s", method, body, r.status, r.raw)
		}
	}
	for _, c := range []struct {
		body   string
		status int
		want   map[string]float64
	}{
		{`{"generations":["1","9"]}`, http.StatusNotFound, map[string]float64{"rollback_policy/policy_not_found": 1}},
		{`{"generations":["0","1"]}`, http.StatusBadRequest, map[string]float64{"rollback_policy/invalid_command": 1}},
		{`{"generations":[]}`, http.StatusBadRequest, map[string]float64{"rollback_policy/invalid_command": 1}},
		{`{"generations":["1","2"]}`, http.StatusOK, map[string]float64{"rollback_policy/ok": 2}},
		{`{"generations":["1","2"]}`, http.StatusOK, map[string]float64{"rollback_policy/replayed": 2}},
	} {
		before := h.commandCounts()
		rollouts("RollbackGenerations", c.body, c.status)
		h.wantCounted(before, c.want)
	}
	before := h.commandCounts()
	h.wantError(h.call("RollbackPolicy", `{"generation":"9"}`, ""), http.StatusNotFound, "not_found", server.ReasonPolicyNotFound)
	h.wantError(h.call("RollbackPolicy", `{}`, ""), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	h.ok("RollbackPolicy", `{"generation":"1"}`, "")
	h.wantCounted(before, map[string]float64{"rollback_policy/policy_not_found": 1, "rollback_policy/invalid_command": 1, "rollback_policy/replayed": 1})
}

// A RollbackGenerations the store cannot commit fails whole (503): each
// of its generations counts once as unavailable, as a batch's items do.
func TestRollbackGenerationsFailedWholeCountsEachUnavailable(t *testing.T) {
	h := newHarness(t, harnessOptions{faults: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-8","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"10"}]}}`, "")
	h.faults.FailCommits(fmt.Errorf("disk gone: %w", store.ErrUnavailable))
	defer h.faults.FailCommits(nil)
	before := h.commandCounts()
	r := h.rollout("RollbackGenerations", `{"generations":["1","2"]}`, "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	h.wantCounted(before, map[string]float64{"rollback_policy/unavailable": 2})
}

// A ReserveBatch or SettleBatch refused for its size (no items, more than
// server.MaxBatchItems) counted nothing; it counts once, as the refusal
// the caller saw.
func TestBatchRefusedForItsSizeCountsOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	tooMany := strings.TrimSuffix(strings.Repeat(reserveBody("x", 1)+",", server.MaxBatchItems+1), ",")
	for _, c := range []struct{ method, body, kind string }{
		{"ReserveBatch", `{"requests":[]}`, "reserve"},
		{"ReserveBatch", `{"requests":[` + tooMany + `]}`, "reserve"},
		{"SettleBatch", `{}`, "settle"},
	} {
		before := h.commandCounts()
		h.wantError(h.call(c.method, c.body, ""), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		h.wantCounted(before, map[string]float64{c.kind + "/invalid_command": 1})
	}
}

// rejectionCount is the value of capledger_rejections_total's series
// with labels (`dimension="tokens",...`) on /metrics, 0 when absent.
func (h *harness) rejectionCount(labels string) float64 {
	h.t.Helper()
	for _, line := range strings.Split(h.get("/metrics"), "\n") {
		if value, ok := strings.CutPrefix(line, "capledger_rejections_total{"+labels+"} "); ok {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				h.t.Fatalf("metrics line %q: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// A protocol adapter (as envoyrls is) counts the capacity rejections its
// call answers by with the call's Answers: counted once the call
// answered, not at all when the call then fails whole (its caller saw no
// rejection, and retries). The adapter here reserves more than is
// available (rejected), then, with ?then=fail, a second command the store
// cannot commit, as a check of several descriptors runs its follow-ups.
func TestAdapterRejectionCountsWithTheAnswer(t *testing.T) {
	h := newHarness(t, harnessOptions{faults: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("all", 900), "") // 100 tokens left
	reserve := func(ctx context.Context, id string, tokens int64) ledger.Command {
		cmd, _, invalid := h.srv.ReserveCommand(ctx, &v1.ReserveRequest{ReservationId: id, Subject: "tenant-7", Route: "chat.generate",
			Units: map[string]int64{"tokens": tokens, "requests": 1}})
		if invalid != nil {
			t.Errorf("reserve %s: %v", id, invalid)
		}
		return cmd
	}
	var calls atomic.Int32
	h.srv.Mount("/test-adapter", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		call := calls.Add(1)
		var answers server.Answers
		var err error
		defer func() {
			h.srv.CountAnswers(&answers, err)
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
			}
		}()
		first := []ledger.Command{reserve(ctx, fmt.Sprintf("big-%d", call), 500)}
		results, cerr := h.srv.Run(ctx, first)
		if cerr != nil {
			answers.Failed(first)
			err = cerr
			return
		}
		answers.Results(first, results)
		if server.Classify(results[0].Err).Capacity {
			answers.Rejected(&results[0])
		}
		if r.URL.Query().Get("then") == "fail" {
			h.faults.FailCommits(fmt.Errorf("disk gone: %w", store.ErrUnavailable))
			defer h.faults.FailCommits(nil)
			second := []ledger.Command{reserve(ctx, fmt.Sprintf("small-%d", call), 1)}
			if _, cerr := h.srv.Run(ctx, second); cerr != nil {
				answers.Failed(second)
				err = cerr
			}
		}
	}))
	const insufficient = `dimension="tokens",reason="INSUFFICIENT_CAPACITY",rollout="enforce"`
	before := h.rejectionCount(insufficient)
	if got := h.get("/test-adapter?then=fail"); !strings.Contains(got, "disk gone") {
		t.Fatalf("the adapter's call did not fail: %q", got)
	}
	if got := h.rejectionCount(insufficient) - before; got != 0 {
		t.Errorf("a call that failed whole counted %g rejections, want 0", got)
	}
	h.get("/test-adapter")
	if got := h.rejectionCount(insufficient) - before; got != 1 {
		t.Errorf("a call that answered its rejection counted %g, want 1", got)
	}
}
