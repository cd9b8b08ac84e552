package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/open"
)

// faultStore is the store a fault test runs serve on: SQLite in the data
// directory (spec "") or a fresh PostgreSQL schema.
type faultStore struct {
	name, spec string
}

// serveArgs are the flags that put serve on the store.
func (s faultStore) serveArgs(extra ...string) []string {
	if s.spec == "" {
		return extra
	}
	return append([]string{"--store", s.spec}, extra...)
}

// auditStopped stops srv (SIGTERM, a clean exit) and runs `capledger
// audit` on the store: it must exit 0 with no discrepancy.
func (s faultStore) auditStopped(t *testing.T, bin, dir string, srv *serverProcess) {
	t.Helper()
	if s.spec == "" {
		auditStoppedDataDir(t, bin, dir, srv)
		return
	}
	stopGracefully(t, srv)
	if r := auditBinary(t, bin, exitOK, "--store", s.spec); len(r.Discrepancies) != 0 {
		t.Fatalf("audit of the stopped store: %+v", r.Discrepancies)
	}
}

// onEachStore runs f on SQLite and, with CAPLEDGER_TEST_POSTGRES set, on a
// fresh PostgreSQL schema.
func onEachStore(t *testing.T, f func(t *testing.T, s faultStore)) {
	t.Run("sqlite", func(t *testing.T) { f(t, faultStore{name: "sqlite"}) })
	t.Run("postgres", func(t *testing.T) { f(t, faultStore{name: "postgres", spec: postgresSchema(t)}) })
}

// lateEpochLength returns a whole number of hours, an epoch length whose
// epoch holding now began more than 25 hours before now and ends more
// than an hour after it: an epoch of it closed now ends past a 24 h
// statement retention, and none ends while a test runs.
func lateEpochLength(now time.Time) time.Duration {
	for h := 27; ; h++ {
		length := time.Duration(h) * time.Hour
		start := ledger.EpochStartOf(now, length)
		if now.Sub(start) > 25*time.Hour && start.Add(length).Sub(now) > time.Hour {
			return length
		}
	}
}

// lateBook is what writeLateBook wrote: the generations of its two
// routes, the late route's epoch length and the start of its epoch
// holding now, and the ends of the hourly statements.
type lateBook struct {
	lateGen, billGen string
	length           time.Duration
	current          time.Time
	billEnds         []time.Time
}

// writeLateBook writes, through an engine whose clock runs in the past,
// on the store spec names (in dir): route "late" (epochs of
// lateEpochLength) where each of closedByWorker and closedByGateway
// reserved in the epoch two before the one holding now, and the epoch
// after it is left open, changed by a reserve (closedByWorker: serve's
// epoch worker closes it) or idle (closedByGateway: the next command
// closes it); and route "bill" (hourly epochs) where each of billed
// reserved in every one of the last billHours hours, each closed with its
// statement, the last at the start of the current hour.
func writeLateBook(t *testing.T, spec, dir string, now time.Time, closedByWorker, closedByGateway, billed []string, billHours int) lateBook {
	t.Helper()
	ctx := context.Background()
	st, err := open.Open(ctx, spec, dir)
	if err != nil {
		t.Fatal(err)
	}
	book := lateBook{length: lateEpochLength(now)}
	book.current = ledger.EpochStartOf(now, book.length)
	twoBefore := book.current.Add(-2 * book.length)
	billFrom := now.UTC().Truncate(time.Hour).Add(-time.Duration(billHours) * time.Hour)
	var clock atomic.Int64
	clock.Store(twoBefore.Add(time.Hour).UnixNano())
	e := engine.New(st, engine.Options{Clock: func() time.Time { return time.Unix(0, clock.Load()) }, DisableWorkers: true})
	do := func(what string, cmd ledger.Command) ledger.Result {
		res, err := e.Do(ctx, cmd)
		if err != nil || res.Err != nil {
			t.Errorf("%s: %+v %v", what, res, err)
		}
		return res
	}
	publish := func(route string, length time.Duration) uint64 {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: "*", Route: route, Region: ledger.DefaultRegion},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EpochLength: length, HoldTTL: 100_000 * time.Hour}.WithDefaults()
		return do("publish "+route, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}).Generation
	}
	lateGen, billGen := publish("late", book.length), publish("bill", time.Hour)
	book.lateGen, book.billGen = fmt.Sprint(lateGen), fmt.Sprint(billGen)
	reserve := func(subject, route, id string) {
		do("reserve "+id, ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: subject, Route: route, Region: ledger.DefaultRegion, Units: ledger.Amounts{1}})
	}
	all := append(append([]string{}, closedByWorker...), closedByGateway...)
	parallel(len(all), func(i int) { reserve(all[i], "late", all[i]+"-twice-before") })
	clock.Store(book.current.Add(-book.length + time.Hour).UnixNano())
	parallel(len(closedByWorker), func(i int) { reserve(closedByWorker[i], "late", closedByWorker[i]+"-before") })
	parallel(len(closedByGateway), func(i int) {
		key := ledger.AccountKey{Subject: closedByGateway[i], Route: "late", Region: ledger.DefaultRegion, Generation: lateGen}
		do("close "+key.String(), ledger.Command{Kind: ledger.KindCloseEpoch, Account: key})
	})
	for h := range billHours {
		clock.Store(billFrom.Add(time.Duration(h) * time.Hour).UnixNano())
		parallel(len(billed), func(i int) { reserve(billed[i], "bill", fmt.Sprintf("%s-h%03d", billed[i], h)) })
		book.billEnds = append(book.billEnds, billFrom.Add(time.Duration(h+1)*time.Hour))
	}
	clock.Store(billFrom.Add(time.Duration(billHours) * time.Hour).UnixNano())
	parallel(len(billed), func(i int) {
		key := ledger.AccountKey{Subject: billed[i], Route: "bill", Region: ledger.DefaultRegion, Generation: billGen}
		do("close "+key.String(), ledger.Command{Kind: ledger.KindCloseEpoch, Account: key})
	})
	e.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	return book
}

// epochStartOf is the epochStart GetAccount answers for subject's one
// account on route.
func epochStartOf(t *testing.T, url, subject, route string) time.Time {
	t.Helper()
	out := mustPost(t, url, "GetAccount", fmt.Sprintf(`{"subject":%q,"route":%q}`, subject, route))
	s, _ := field(out, "accounts", "0", "epochStart").(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("GetAccount %s/%s: %v (%v)", subject, route, out, err)
	}
	return at
}

// TestLateStatementGoesAtTheNextPass: a statement written late, its
// epoch ended more than `--statement-retention 24h` before it is
// written, is due when written (docs/OPERATIONS.md, "Epoch statements")
// and goes at the next retention pass, whether the pass under way when it
// was written saw it or not: kept neither before it is written (nothing
// kept is lost) nor for ever. The store holds, from an engine whose clock
// ran in the past, accounts on a route of epochs longer than a day whose
// epoch before the current one is still open, past the cut: 12 changed
// in it, which serve's epoch worker closes as it starts (racing the first
// retention passes), 24 idle in it, whose next reserve closes it (12 while
// passes run every 50 ms, 12 more as serve is killed with SIGKILL at a
// seeded random point among them, the rest retried after the restart);
// and 20 accounts of hourly statements ending from 30 hours ago to now.
// Once two passes ended after a late statement was written (or one ran
// whole after a restart that followed it), the account lists no
// statement; every hourly statement that ended within the last 24 hours
// is listed, as it was before the kill, in an unbroken chain, and those
// ended more than 24 hours before the last pass began are gone; the audit
// of the stopped store (statement_chain included) is clean.
func TestLateStatementGoesAtTheNextPass(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	onEachStore(t, testLateStatementGoesAtTheNextPass)
}

func testLateStatementGoesAtTheNextPass(t *testing.T, fs faultStore) {
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	const billHours = 30
	names := func(prefix string, n int) []string {
		var s []string
		for i := range n {
			s = append(s, fmt.Sprintf("%s-%02d", prefix, i))
		}
		return s
	}
	byWorker, beforeKill, atKill, billed := names("lw", 12), names("lx", 12), names("ly", 12), names("bk", 20)
	book := writeLateBook(t, fs.spec, dir, time.Now(), byWorker, append(append([]string{}, beforeKill...), atKill...), billed, billHours)
	t.Logf("late route: %s epochs, the current one began %s ago", book.length, time.Since(book.current).Round(time.Minute))
	lateAccount := func(s string) statementAccount {
		return statementAccount{subject: s, route: "late", generation: book.lateGen}
	}
	billAccount := func(s string) statementAccount {
		return statementAccount{subject: s, route: "bill", generation: book.billGen}
	}

	retire := fs.serveArgs("--retention", "720h", "--statement-retention", "24h", "--retention-interval", "50ms", "--compaction", "0", "--maintenance-share", "1")
	passes := func(url string) int64 { return counter(statusz(t, url), "retention", "passes") }
	// gone waits until want passes ended, then wants every account of
	// subjects to list no statement.
	gone := func(url, what string, want int64, subjects []string) {
		t.Helper()
		if !pollUntil(time.Minute, func() bool { return passes(url) >= want }) {
			t.Fatalf("%s: retention passes did not reach %d within a minute: %v", what, want, statusz(t, url))
		}
		for _, s := range subjects {
			for _, r := range listAllStatements(t, url, lateAccount(s), 10) {
				t.Errorf("%s: %s lists its statement of [%s, %s) after %d passes, due when written", what, s, r.start, r.end, want)
			}
		}
	}
	// closeLate sends a reserve to each subject's account, whose idle
	// epoch it closes past the cut, from 4 gateways; it returns, for each
	// acknowledged one, the passes counted after the acknowledgement (-1:
	// no answer), and calls afterAck with the number acknowledged so far.
	closeLate := func(url string, subjects []string, afterAck func(int)) []int64 {
		seen := make([]int64, len(subjects))
		var acked atomic.Int64
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1) - 1); i < len(subjects); i = int(next.Add(1) - 1) {
					seen[i] = -1
					status, out := post(crashClient, url, "Reserve", fmt.Sprintf(`{"reservationId":"%s-now","subject":%q,"route":"late","units":{"tokens":1}}`, subjects[i], subjects[i]))
					if status == 0 {
						continue
					}
					if status != 200 {
						t.Errorf("reserve on %s: %d %v", subjects[i], status, out)
						continue
					}
					if seen[i] = passes(url); seen[i] < 0 {
						seen[i] = -1 // killed before the count was read: counted as unanswered, and retried
						continue
					}
					if afterAck != nil {
						afterAck(int(acked.Add(1)))
					}
				}
			}()
		}
		wg.Wait()
		return seen
	}
	wantEpoch := func(url string, subjects []string) {
		t.Helper()
		for _, s := range subjects {
			if got := epochStartOf(t, url, s, "late"); !got.Equal(book.current) {
				t.Errorf("%s: epoch from %s, want the current one from %s", s, got, book.current)
			}
		}
	}

	srv := startServer(t, bin, dir, retire...)
	// serve's epoch worker closes the changed epochs as it starts.
	if !pollUntil(time.Minute, func() bool {
		for _, s := range byWorker {
			if !epochStartOf(t, srv.url, s, "late").Equal(book.current) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the epoch worker did not close the changed late epochs within a minute")
	}
	gone(srv.url, "closed by the epoch worker", passes(srv.url)+2, byWorker)
	// Every hourly statement listed now: those within the last 24 h are
	// listed again, the same, after the kill.
	listed := map[string][]statementRow{}
	for _, s := range billed {
		listed[s] = listAllStatements(t, srv.url, billAccount(s), 1000)
	}

	seen := closeLate(srv.url, beforeKill, nil)
	most := int64(0)
	for i, p := range seen {
		if p < 0 {
			t.Fatalf("reserve on %s unanswered before any kill", beforeKill[i])
		}
		most = max(most, p)
	}
	gone(srv.url, "closed by a reserve as passes run", most+2, beforeKill)
	wantEpoch(srv.url, append(append([]string{}, byWorker...), beforeKill...))

	// SIGKILL once killAfter of the next reserves were acknowledged.
	killAfter := rng.IntN(len(atKill))
	var killOnce sync.Once
	kill := func() { killOnce.Do(func() { kill9(t, srv) }) }
	if killAfter == 0 {
		kill()
	}
	seen = closeLate(srv.url, atKill, func(acked int) {
		if acked >= killAfter {
			kill()
		}
	})
	kill()
	var unanswered []string
	for i, p := range seen {
		if p < 0 {
			unanswered = append(unanswered, atKill[i])
		}
	}
	t.Logf("killed after %d of %d reserves closing late epochs were acknowledged; %d unanswered", killAfter, len(atKill), len(unanswered))

	srv = startServer(t, bin, dir, retire...)
	// Written before the kill: the first pass after the restart takes it.
	acked := []string{}
	for i, p := range seen {
		if p >= 0 {
			acked = append(acked, atKill[i])
		}
	}
	gone(srv.url, "closed before the kill", 1, acked)
	// The unanswered reserves retried: each landed before the kill or
	// closes its epoch now.
	seen = closeLate(srv.url, unanswered, nil)
	most = 0
	for i, p := range seen {
		if p < 0 {
			t.Fatalf("reserve on %s retried after the restart: unanswered", unanswered[i])
		}
		most = max(most, p)
	}
	gone(srv.url, "closed by a retry after the restart", most+2, unanswered)
	wantEpoch(srv.url, append(append([]string{}, atKill...), byWorker...))
	// A pass that began now ends: what was due when it began is gone.
	passFrom := time.Now()
	last := passes(srv.url) + 2
	gone(srv.url, "every late account", last, append(append(append([]string{}, byWorker...), beforeKill...), atKill...))
	cutoff := time.Now().Add(-24 * time.Hour)
	for _, s := range billed {
		rows := listAllStatements(t, srv.url, billAccount(s), 7+rng.IntN(20))
		kept := map[time.Time]bool{}
		for _, r := range rows {
			kept[r.end] = true
			if r.end.Before(passFrom.Add(-24 * time.Hour)) {
				t.Errorf("%s: the statement of [%s, %s) was due when the last pass began, and is kept", s, r.start, r.end)
			}
		}
		for _, end := range book.billEnds {
			if !end.Before(cutoff) && !kept[end] {
				t.Errorf("%s: the statement ending %s, within the 24 h kept, is gone", s, end)
			}
		}
		// The kept ones are the latest, as listed before the kill.
		before := listed[s]
		if len(before) < len(rows) {
			t.Errorf("%s: %d statements listed, %d before the kill", s, len(rows), len(before))
			continue
		}
		for i, r := range rows {
			if r.raw != before[i].raw {
				t.Errorf("%s: statement %d is %s, was %s before the kill", s, i, r.raw, before[i].raw)
			}
		}
	}
	t.Logf("%d retention passes in the last run, %d statements removed", passes(srv.url), counter(statusz(t, srv.url), "retention", "statementsRemoved"))
	fs.auditStopped(t, bin, dir, srv)
}
