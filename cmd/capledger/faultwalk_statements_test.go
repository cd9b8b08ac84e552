package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/sqlite"
)

// statementRow is one epoch statement as ListStatements answered it.
type statementRow struct {
	start, end time.Time
	raw        string // the whole statement
	opening    string
	closing    string
}

// statementAccount names one account whose statements the test lists.
type statementAccount struct {
	subject, route string
	generation     string
}

// listAllStatements pages through an account's statements (pageSize a
// page) and checks what ListStatements promises of each page: the latest
// epoch first, at most pageSize statements, and each opening where the
// one before it (older) closed.
func listAllStatements(t *testing.T, url string, a statementAccount, pageSize int) []statementRow {
	t.Helper()
	var rows []statementRow
	token := ""
	for {
		out := mustPost(t, url, "ConsoleService/ListStatements", fmt.Sprintf(`{"subject":%q,"route":%q,"policyGeneration":%q,"pageSize":%d,"pageToken":%q}`,
			a.subject, a.route, a.generation, pageSize, token))
		page, _ := out["statements"].([]any)
		if len(page) > pageSize {
			t.Errorf("%s/%s: a page of %d statements, asked for %d", a.subject, a.route, len(page), pageSize)
		}
		for _, s := range page {
			m := asMap(s)
			start, err1 := time.Parse(time.RFC3339Nano, fmt.Sprint(m["epochStart"]))
			end, err2 := time.Parse(time.RFC3339Nano, fmt.Sprint(m["epochEnd"]))
			if err1 != nil || err2 != nil {
				t.Fatalf("%s/%s: statement %v: %v %v", a.subject, a.route, m, err1, err2)
			}
			rows = append(rows, statementRow{start: start, end: end, raw: fmt.Sprint(m), opening: fmt.Sprint(m["opening"]), closing: fmt.Sprint(m["closing"])})
		}
		token, _ = out["nextPageToken"].(string)
		if token == "" {
			break
		}
	}
	for i := 1; i < len(rows); i++ {
		if !rows[i].end.After(rows[i].start) || rows[i].end.After(rows[i-1].start) {
			t.Errorf("%s/%s: statement %d [%s, %s) after [%s, %s): not the latest first", a.subject, a.route, i, rows[i].start, rows[i].end, rows[i-1].start, rows[i-1].end)
		}
		if rows[i-1].opening != rows[i].closing {
			t.Errorf("%s/%s: the statement of [%s, %s) opens %s, the one before closed %s", a.subject, a.route, rows[i-1].start, rows[i-1].end, rows[i-1].opening, rows[i].closing)
		}
	}
	return rows
}

// writeOldEpochs writes, through an engine whose clock runs from base,
// hourly epochs with a reserve in each: for subject i of hours, hours[i]
// epochs from base on (a route "bill" policy of one-hour epochs and holds
// that never run out), each closed with its statement.
func writeOldEpochs(t *testing.T, dir string, base time.Time, subjects []string, hours []int) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, open.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64
	now.Store(base.UnixNano())
	e := engine.New(st, engine.Options{Clock: func() time.Time { return time.Unix(0, now.Load()) }, DisableWorkers: true})
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: "*", Route: "bill", Region: ledger.DefaultRegion},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EpochLength: time.Hour, HoldTTL: 100_000 * time.Hour}.WithDefaults()
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		t.Fatalf("publish: %+v %v", res, err)
	}
	most := 0
	for _, h := range hours {
		most = max(most, h)
	}
	for h := range most {
		parallel(len(subjects), func(i int) {
			if h >= hours[i] {
				return
			}
			id := fmt.Sprintf("%s-h%03d", subjects[i], h)
			if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
				Subject: subjects[i], Route: "bill", Region: ledger.DefaultRegion, Units: ledger.Amounts{1}}); err != nil || res.Err != nil {
				t.Errorf("reserve %s: %+v %v", id, res, err)
			}
		})
		if t.Failed() {
			t.FailNow()
		}
		now.Add(int64(time.Hour))
		// Each account's last epoch is closed as it ends, as serve's
		// epoch worker would have (left open, serve would close it now
		// in one statement spanning the idle hours since, kept a day).
		parallel(len(subjects), func(i int) {
			if h+1 != hours[i] {
				return
			}
			key := ledger.AccountKey{Subject: subjects[i], Route: "bill", Region: ledger.DefaultRegion, Generation: 1}
			if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindCloseEpoch, Account: key}); err != nil || res.Err != nil || res.Replayed {
				t.Errorf("close the last epoch of %s: %+v %v", key, res, err)
			}
		})
	}
	e.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCrashMidStatementRetention kills serve with SIGKILL, at seeded
// random points, while `serve --statement-retention 24h` removes epoch
// statements (256 a transaction, the earliest ended first), with
// gateways closing one-second epochs on another route meanwhile. The data
// directory holds 100 hours of hourly statements of 40 accounts and 60
// hours, all older than a day, of 40 more (written by an engine whose
// clock ran in the past, the real binary after it). After each restart
// (without statement retention) every account's statements are listed
// latest first, page by page, each opening where the one before closed,
// each exactly as before the kill; none whose epoch ended within the
// last 24 hours is gone, nor any of the one-second epochs; what went is
// the earliest ended (no kept statement ended before a removed one), at
// least as many as /statusz counted before the kill; and the audit of the
// stopped data directory (statement_chain included) is clean. A last
// pass, run to its end, removes every statement that was due when it
// began: an account whose statements all went lists none, without an
// error, and /metrics counts what /statusz counts.
func TestCrashMidStatementRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs several server processes")
	}
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	const (
		accounts  = 40
		goneHours = 60
		keptHours = 100
		live      = 8
	)
	var subjects []string
	var hours []int
	var old []statementAccount
	for i := range accounts {
		for _, g := range []struct {
			prefix string
			hours  int
		}{{"sg", goneHours}, {"sk", keptHours}} {
			subjects = append(subjects, fmt.Sprintf("%s-%02d", g.prefix, i))
			hours = append(hours, g.hours)
			old = append(old, statementAccount{subject: subjects[len(subjects)-1], route: "bill", generation: "1"})
		}
	}
	base := time.Now().UTC().Truncate(time.Hour).Add(-keptHours * time.Hour)
	began := time.Now()
	writeOldEpochs(t, dir, base, subjects, hours)
	t.Logf("wrote %d accounts' hourly epochs from %s in %s", len(subjects), base.Format(time.RFC3339), time.Since(began).Round(time.Millisecond))

	quiet := []string{"--retention", "0", "--compaction", "0"}
	srv := startServer(t, bin, dir, quiet...)
	liveGen := fmt.Sprint(field(mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"live","holdTtl":"360000s","epochLength":"1s",
	  "dimensions":[{"unit":"tokens","burst":"1000000"}]}}`), "policy", "generation"))
	var liveAccounts []statementAccount
	for i := range live {
		liveAccounts = append(liveAccounts, statementAccount{subject: fmt.Sprintf("sl-%d", i), route: "live", generation: liveGen})
	}
	// 60 and 100 statements.
	before := map[string][]statementRow{}
	if !pollUntil(time.Minute, func() bool {
		for i, a := range old {
			if before[a.subject] = listAllStatements(t, srv.url, a, 1000); len(before[a.subject]) != hours[i] {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the old accounts' statements not listed within a minute")
	}
	stopGracefully(t, srv)
	total := 0
	for _, rows := range before {
		total += len(rows)
	}

	present := map[string]int{} // statements of each old account still listed (the latest ones)
	for _, a := range old {
		present[a.subject] = len(before[a.subject])
	}
	remaining := func() (due, kept int) {
		cutoff := time.Now().Add(-24 * time.Hour)
		for _, a := range old {
			for _, s := range before[a.subject][:present[a.subject]] {
				if s.end.Before(cutoff) {
					due++
				} else {
					kept++
				}
			}
		}
		return due, kept
	}
	due, _ := remaining()
	t.Logf("%d statements, %d of them ended more than 24 h ago", total, due)

	// check lists every account on a quiet serve after a kill: what is
	// listed is what was before, less the earliest ended; nothing of the
	// last 24 h went. It returns how many of the old statements went since
	// the last check.
	check := func(round int, url string, liveSeen map[string][]statementRow) int {
		cutoff := time.Now().Add(-24 * time.Hour)
		var latestRemoved, earliestKept time.Time
		removed := 0
		for _, a := range old {
			rows := listAllStatements(t, url, a, 7+rng.IntN(60))
			was := before[a.subject]
			if len(rows) > present[a.subject] {
				t.Errorf("round %d: %s lists %d statements, %d before", round, a.subject, len(rows), present[a.subject])
				continue
			}
			for i, s := range rows {
				if s.raw != was[i].raw {
					t.Errorf("round %d: %s's statement %d is %s, was %s", round, a.subject, i, s.raw, was[i].raw)
				}
			}
			for _, s := range was[len(rows):] {
				if !s.end.Before(cutoff) {
					t.Errorf("round %d: %s's statement of [%s, %s), ended within the 24 h kept, is gone", round, a.subject, s.start, s.end)
				}
				if s.end.After(latestRemoved) {
					latestRemoved = s.end
				}
			}
			if len(rows) > 0 && (earliestKept.IsZero() || rows[len(rows)-1].end.Before(earliestKept)) {
				earliestKept = rows[len(rows)-1].end
			}
			removed += present[a.subject] - len(rows)
			present[a.subject] = len(rows)
		}
		if !earliestKept.IsZero() && earliestKept.Before(latestRemoved) {
			t.Errorf("round %d: a statement that ended at %s is gone while one that ended at %s is kept: not the earliest ended first", round, latestRemoved, earliestKept)
		}
		for _, a := range liveAccounts {
			rows := listAllStatements(t, url, a, 100)
			listed := map[string]bool{}
			for _, s := range rows {
				listed[s.raw] = true
			}
			for _, s := range liveSeen[a.subject] {
				if !listed[s.raw] {
					t.Errorf("round %d: %s's one-second epoch [%s, %s), listed before the kill, is gone", round, a.subject, s.start, s.end)
				}
			}
		}
		return removed
	}

	retire := []string{"--retention", "720h", "--statement-retention", "24h", "--retention-interval", "50ms", "--compaction", "0", "--maintenance-share", "1"}
	kill := func(round int, target int64) {
		srv := startServer(t, bin, dir, retire...)
		// Gateways close one-second epochs on the live route meanwhile.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range live {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					if status, _ := post(crashClient, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":"live-%d-%d-%d","subject":"sl-%d","route":"live","units":{"tokens":1}}`,
						round, i, n, i)); status != 200 {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
		var st map[string]any
		if !pollUntil(2*time.Minute, func() bool {
			st = statusz(t, srv.url)
			return counter(st, "retention", "statementsRemoved") >= target
		}) {
			t.Fatalf("round %d: statementsRemoved did not reach %d: %v", round, target, st)
		}
		time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
		liveSeen := map[string][]statementRow{}
		for _, a := range liveAccounts {
			liveSeen[a.subject] = listAllStatements(t, srv.url, a, 1000)
		}
		st = statusz(t, srv.url)
		kill9(t, srv)
		close(stop)
		wg.Wait()
		seen := counter(st, "retention", "statementsRemoved")
		srv = startServer(t, bin, dir, quiet...)
		removed := check(round, srv.url, liveSeen)
		if int64(removed) < seen {
			t.Errorf("round %d: %d statements gone, /statusz counted %d removed before the kill", round, removed, seen)
		}
		due, kept := remaining()
		t.Logf("round %d: killed when statementsRemoved reached %d (%d just before the kill): %d gone since the last round, %d due left, %d kept of %d", round, target, seen, removed, due, kept, total)
		auditStoppedDataDir(t, bin, dir, srv)
		if t.Failed() {
			t.FailNow()
		}
	}
	// Two kills at random points of the removal (the second among what
	// the first left), then one as it ends.
	gone := func() int64 { due, _ := remaining(); return int64(due) }
	kill(0, 1+rng.Int64N(gone()/2))
	if n := gone(); n > 0 {
		kill(1, 1+rng.Int64N(n))
	}
	if n := gone(); n > 0 {
		kill(2, n)
	}

	// A pass run to its end removes every statement due when it began.
	passFrom := time.Now()
	srv = startServer(t, bin, dir, retire...)
	if !pollUntil(2*time.Minute, func() bool { return counter(statusz(t, srv.url), "retention", "passes") >= 1 }) {
		t.Fatal("no retention pass ended within 2 minutes")
	}
	st := statusz(t, srv.url)
	if got, want := metricValue(t, srv.url, `capledger_retention_removed_total{kind="statement"}`), counter(st, "retention", "statementsRemoved"); int64(got) != want {
		t.Errorf(`capledger_retention_removed_total{kind="statement"} %v, /statusz statementsRemoved %d`, got, want)
	}
	stopGracefully(t, srv)
	srv = startServer(t, bin, dir, quiet...)
	check(3, srv.url, nil)
	for _, a := range old {
		for _, s := range before[a.subject][:present[a.subject]] {
			if s.end.Before(passFrom.Add(-24 * time.Hour)) {
				t.Errorf("%s's statement of [%s, %s) was due when the last pass began, and is kept", a.subject, s.start, s.end)
			}
		}
		if a.subject[:2] == "sg" {
			out := mustPost(t, srv.url, "ConsoleService/ListStatements", fmt.Sprintf(`{"subject":%q,"route":"bill","policyGeneration":"1"}`, a.subject))
			if sts, _ := out["statements"].([]any); len(sts) != 0 || out["nextPageToken"] != nil {
				t.Errorf("ListStatements of %s, every statement gone: %v, want none", a.subject, out)
			}
		}
	}
	due, kept := remaining()
	t.Logf("after the last pass: %d due left, %d kept", due, kept)
	auditStoppedDataDir(t, bin, dir, srv)
}
