package main

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// API.md, "Retention: removed reservations", over the real serve with
// short windows: while a removed reservation's tombstone lives every call
// on its id is answered from it (the table there, row by row) and changes
// no account; after the tombstone horizon the id is unknown (404) and a
// Reserve with it admits a new reservation.
func TestTombstoneAnswersOverTheAPI(t *testing.T) {
	url := startInProcess(t, "--retention", "1s", "--tombstone-retention", "6s", "--retention-interval", "100ms", "--compaction", "0")
	mustPost(t, url, "PublishPolicy", `{"policy":{"subject":"*","route":"chat","holdTtl":"0.1s",
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"1","refillInterval":"3600s"}]}}`)
	reserve := func(id string, tokens int) string {
		return fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-1","route":"chat","units":{"tokens":%d}}`, id, tokens)
	}
	mustPost(t, url, "Reserve", reserve("settled", 10))
	mustPost(t, url, "Start", `{"reservationId":"settled","operationId":"op-1"}`)
	mustPost(t, url, "Settle", `{"reservationId":"settled","operationId":"op-1","actualUnits":{"tokens":4}}`)
	mustPost(t, url, "Reserve", reserve("released", 10))
	mustPost(t, url, "Release", `{"reservationId":"released"}`)
	mustPost(t, url, "Reserve", reserve("expired", 10)) // the expiry worker takes it after 0.1 s
	ids := []string{"settled", "released", "expired"}

	// Wait for retention to remove all three (1 s after they finished).
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			status, body := post(crashClient, url, "GetReservation", `{"reservationId":"`+id+`"}`)
			if status == 200 && field(body, "reservation", "retired") == true {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not removed by retention: %d %v", id, status, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	account := `{"subject":"tenant-1","route":"chat"}`
	before := fmt.Sprint(mustPost(t, url, "GetAccount", account))

	type call struct {
		method, body string
		status       int
		reason       string // "" for 200
	}
	stateError := map[string]string{"settled": "RESERVATION_ALREADY_SETTLED", "released": "RESERVATION_RELEASED", "expired": "RESERVATION_EXPIRED"}
	states := map[string]string{"settled": "RESERVATION_STATE_SETTLED", "released": "RESERVATION_STATE_RELEASED", "expired": "RESERVATION_STATE_EXPIRED"}
	for _, id := range ids {
		release := call{"Release", `{"reservationId":"` + id + `"}`, 400, stateError[id]}
		if id == "released" {
			release.status, release.reason = 200, "" // a replay
		}
		calls := []call{
			{"Reserve", reserve(id, 10), 200, ""},
			{"Reserve", reserve(id, 11), 409, "DIGEST_MISMATCH"},
			{"Settle", `{"reservationId":"` + id + `","operationId":"op-1","actualUnits":{"tokens":4}}`, 400, stateError[id]},
			{"Start", `{"reservationId":"` + id + `","operationId":"op-1"}`, 400, stateError[id]},
			{"MarkUsageUnknown", `{"reservationId":"` + id + `"}`, 400, stateError[id]},
			{"GetReservation", `{"reservationId":"` + id + `"}`, 200, ""},
			release,
		}
		for _, c := range calls {
			status, body := post(crashClient, url, c.method, c.body)
			reason, _ := field(body, "details", "0", "debug", "reason").(string)
			if status != c.status || reason != c.reason {
				t.Errorf("%s %s: %d %s %v, want %d %s", c.method, c.body, status, reason, body, c.status, c.reason)
				continue
			}
			// The receipt (the answer's, or the error detail's) is the
			// tombstone's: retired, terminal, without units.
			receipt := field(body, "reservation")
			if status != 200 {
				receipt = field(body, "details", "0", "debug", "reservation")
			}
			if c.reason == "DIGEST_MISMATCH" {
				continue // the detail carries no reservation
			}
			r, _ := receipt.(map[string]any)
			if r["retired"] != true || r["state"] != states[id] || r["reservedUnits"] != nil || r["finishedAt"] == nil {
				t.Errorf("%s %s: receipt %v, want the tombstone's (retired, %s, no units)", c.method, c.body, receipt, states[id])
			}
			if c.method != "GetReservation" && status == 200 && field(body, "replayed") != true {
				t.Errorf("%s %s: %v, want replayed", c.method, c.body, body)
			}
		}
	}
	if after := fmt.Sprint(mustPost(t, url, "GetAccount", account)); after != before {
		t.Errorf("calls answered from tombstones changed the account:\n%s\n%s", before, after)
	}

	// Past the tombstone horizon (6 s after each finished) the id is
	// unknown again, and a Reserve with it is a new reservation.
	deadline = time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			status, body := post(crashClient, url, "GetReservation", `{"reservationId":"`+id+`"}`)
			if status == 404 && field(body, "details", "0", "debug", "reason") == "RESERVATION_NOT_FOUND" {
				break
			}
			if status != 200 || time.Now().After(deadline) {
				t.Fatalf("%s after the tombstone horizon: %d %v, want 404 RESERVATION_NOT_FOUND", id, status, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	again := mustPost(t, url, "Reserve", reserve("settled", 10))
	if again["replayed"] == true || field(again, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Fatalf("Reserve of an id past its tombstone: %v, want a new RESERVED reservation", again)
	}
}

// field walks decoded JSON by object keys and, for arrays, decimal
// indexes ("0"); nil when the path is absent.
func field(v any, path ...string) any {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			var i int
			if _, err := fmt.Sscan(p, &i); err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// OPERATIONS.md, "Checking it works": while a retention pass runs,
// /statusz shows its start and how long it has run (retention.
// passRunningSince, passRunningSeconds) and /metrics the same length
// (capledger_retention_pass_running_seconds), so a backlog's one long
// pass shows before it ends; once it ends both are gone (the gauge 0)
// and lastPassAt / lastPassSeconds describe it.
func TestRetentionPassUnderWayShows(t *testing.T) {
	url := startInProcess(t, "--retention", "1s", "--retention-interval", "100ms", "--compaction", "0")
	mustPost(t, url, "PublishPolicy", `{"policy":{"subject":"*","route":"chat","holdTtl":"0.1s",
	  "dimensions":[{"unit":"tokens","burst":"1000000","refillUnits":"1","refillInterval":"3600s"}]}}`)
	// A backlog: holds the expiry worker ends at once, due a second later.
	const batches, perBatch = 10, 1000
	for b := range batches {
		items := make([]string, perBatch)
		for i := range items {
			items[i] = fmt.Sprintf(`{"reservationId":"bk-%d-%d","subject":"s-%d","route":"chat","units":{"tokens":1}}`, b, i, i%64)
		}
		checkOutcomes(t, mustPost(t, url, "ReserveBatch", `{"requests":[`+strings.Join(items, ",")+`]}`), "reserve")
	}
	runningGauge := func() float64 {
		resp, err := crashClient.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^capledger_retention_pass_running_seconds (\S+)$`).FindSubmatch(raw)
		if m == nil {
			t.Fatalf("/metrics has no capledger_retention_pass_running_seconds")
		}
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Poll both until each has shown a pass under way (passes end and
	// start again as the expiry worker makes more rows due, so the two
	// are not read at one instant).
	statusSeen, gaugeSeen := false, false
	deadline := time.Now().Add(60 * time.Second)
	for !statusSeen || !gaugeSeen {
		if time.Now().After(deadline) {
			t.Fatalf("no retention pass seen under way: on /statusz %v, on /metrics %v", statusSeen, gaugeSeen)
		}
		r, _ := statusz(t, url)["retention"].(map[string]any)
		if r["passRunningSince"] != nil {
			since, err := time.Parse(time.RFC3339Nano, r["passRunningSince"].(string))
			if secs, _ := r["passRunningSeconds"].(float64); err != nil || secs <= 0 || time.Since(since) < 0 {
				t.Fatalf("/statusz retention under way: %v", r)
			}
			statusSeen = true
		}
		if runningGauge() > 0 {
			gaugeSeen = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The backlog's removal gets its own, generous deadline: a page is a
	// commit, and beside a CI run's other packages a commit's fsync took
	// 50-60 ms, so 20,000 rows took more than the minute above.
	deadline = time.Now().Add(5 * time.Minute)
	for {
		st := statusz(t, url)
		r, _ := st["retention"].(map[string]any)
		if counter(st, "retention", "retired") == batches*perBatch && r["passRunningSince"] == nil {
			if secs, _ := r["lastPassSeconds"].(float64); secs <= 0 || r["lastPassAt"] == nil || r["passRunningSeconds"] != nil {
				t.Fatalf("/statusz retention after the pass: %v", r)
			}
			if g := runningGauge(); g != 0 {
				t.Fatalf("no pass under way, capledger_retention_pass_running_seconds %v", g)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backlog was not removed: %v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With --compaction on, /statusz's compaction block and /metrics'
// capledger_compaction_* counters show the checkpoints cut and the
// journal rows deleted behind them (API.md, Metrics; OPERATIONS.md,
// "Checking it works"), and the two agree.
func TestCompactionShowsOnStatuszAndMetrics(t *testing.T) {
	url := startInProcess(t, "--compaction", "1s", "--compaction-interval", "100ms")
	mustPost(t, url, "PublishPolicy", `{"policy":{"subject":"*","route":"chat",
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"1","refillInterval":"3600s"}]}}`)
	metric := func(name string) float64 {
		resp, err := crashClient.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(raw)
		if m == nil {
			t.Fatalf("/metrics has no %s", name)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		// Journal entries for the next cut to summarise and delete.
		mustPost(t, url, "Reserve", fmt.Sprintf(`{"reservationId":"c-%d","subject":"s","route":"chat","units":{"tokens":1}}`, i))
		st := statusz(t, url)
		c, _ := st["compaction"].(map[string]any)
		if counter(st, "compaction", "checkpoints") >= 2 && counter(st, "compaction", "journalRowsDeleted") >= 1 {
			if counter(st, "compaction", "lastCheckpoint") < 2 || c["lastCutAt"] == nil || counter(st, "compaction", "refused") != 0 {
				t.Fatalf("/statusz compaction: %v", c)
			}
			if got := metric("capledger_compaction_checkpoints_total"); got < 2 {
				t.Fatalf("capledger_compaction_checkpoints_total %v, /statusz %v", got, c)
			}
			if got := metric("capledger_compaction_journal_rows_deleted_total"); got < 1 {
				t.Fatalf("capledger_compaction_journal_rows_deleted_total %v, /statusz %v", got, c)
			}
			if got := metric("capledger_compaction_refused_total"); got != 0 {
				t.Fatalf("capledger_compaction_refused_total %v", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoints cut: /statusz compaction %v", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
