package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// scriptedSource answers each operation as its script says and counts
// the questions, as the HTTP source in cmd does for a real endpoint.
type scriptedSource struct {
	mu      sync.Mutex
	answers map[string]func() (OperationStatus, error)
	asked   map[string]int
	order   []string
}

func newScripted() *scriptedSource {
	return &scriptedSource{answers: map[string]func() (OperationStatus, error){}, asked: map[string]int{}}
}

func (s *scriptedSource) set(op string, st OperationStatus, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[op] = func() (OperationStatus, error) { return st, err }
}

func (s *scriptedSource) OperationStatus(ctx context.Context, r *ledger.Reservation) (OperationStatus, error) {
	s.mu.Lock()
	s.asked[r.OperationID]++
	s.order = append(s.order, r.OperationID)
	answer, ok := s.answers[r.OperationID]
	s.mu.Unlock()
	if !ok {
		return OperationStatus{}, ErrNoStatusEndpoint
	}
	return answer()
}

func (s *scriptedSource) count(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[op]
}

// unknownWork reserves 300 tokens per id, starts it under "op-"+id and
// lets the execution limit (30 s) mark it USAGE_UNKNOWN, one second apart
// in the order given.
func unknownWork(t *testing.T, e *Engine, clk *clock, ids ...string) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		for _, c := range []ledger.Command{reserveCmd(id, 300), {Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id}} {
			if res, err := e.Do(ctx, c); err != nil || res.Err != nil {
				t.Fatal(id, err, res.Err)
			}
		}
	}
	clk.Advance(31 * time.Second)
	for _, id := range ids {
		if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id}); err != nil || res.Err != nil {
			t.Fatal(id, err, res.Err)
		}
		clk.Advance(time.Second)
	}
}

func state(t *testing.T, e *Engine, id string) ledger.Reservation {
	t.Helper()
	r, err := e.Reservation(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func reservedTokens(t *testing.T, e *Engine) (reserved, spent int64) {
	t.Helper()
	accounts, err := e.Accounts(context.Background(), ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if err != nil || len(accounts) != 1 {
		t.Fatal(err, len(accounts))
	}
	return accounts[0].Balances[0].Reserved, accounts[0].Balances[0].Spent
}

func TestResolverSettlesOnlyOnReceipts(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now, Resolver: &ResolverOptions{Source: src}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	ids := []string{"fin", "never", "run", "unk", "timeout", "badunit", "noendpoint"}
	unknownWork(t, e, clk, ids...)
	src.set("op-fin", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 120}}, nil)
	src.set("op-never", OperationStatus{State: OperationNeverStarted}, nil)
	src.set("op-run", OperationStatus{State: OperationRunning}, nil)
	src.set("op-unk", OperationStatus{State: OperationUnknown}, nil)
	src.set("op-timeout", OperationStatus{}, context.DeadlineExceeded)
	src.set("op-badunit", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"requests": 1}}, nil)

	e.RunResolver(ctx)
	if r := state(t, e, "fin"); r.State != ledger.StateSettled || r.Actual[0] != 120 {
		t.Fatalf("finished answer: %s actual %v, want SETTLED 120", r.State, r.Actual[0])
	}
	if r := state(t, e, "never"); r.State != ledger.StateSettled || r.Actual[0] != 0 {
		t.Fatalf("never-started answer: %s actual %v, want SETTLED 0", r.State, r.Actual[0])
	}
	for _, id := range []string{"run", "unk", "timeout", "badunit", "noendpoint"} {
		if r := state(t, e, id); r.State != ledger.StateUsageUnknown {
			t.Fatalf("%s: %s, want it to stay USAGE_UNKNOWN", id, r.State)
		}
	}
	// Five stay held at 300 each: UNKNOWN is never treated as unconsumed.
	if reserved, spent := reservedTokens(t, e); reserved != 5*300 || spent != 120 {
		t.Fatalf("reserved %d spent %d, want 1500 and 120", reserved, spent)
	}
	if s := e.ResolverStats(); s.Settled != 2 || s.SettledNeverStarted != 1 || s.Polls != 6 || s.Failures != 2 {
		t.Fatalf("stats %+v", s)
	}

	// Asked again before the backoff passed: nobody is asked.
	e.RunResolver(ctx)
	if n := src.count("op-run"); n != 1 {
		t.Fatalf("asked %d times within the backoff", n)
	}
	// The running work finishes; past the backoff it settles, once.
	src.set("op-run", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 450}}, nil)
	clk.Advance(2 * time.Second)
	e.RunResolver(ctx)
	if r := state(t, e, "run"); r.State != ledger.StateSettled || r.Actual[0] != 450 {
		t.Fatalf("finished after running: %s actual %v, want SETTLED at 450 (overuse from available)", r.State, r.Actual[0])
	}
	if n := src.count("op-fin"); n != 1 {
		t.Fatalf("a settled reservation was asked again (%d)", n)
	}
	auditClean(t, e)
}

func TestResolverBacksOffWithJitter(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now,
		Resolver: &ResolverOptions{Source: src, MinBackoff: time.Second, MaxBackoff: 8 * time.Second, Seed: 7}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	unknownWork(t, e, clk, "slow")
	src.set("op-slow", OperationStatus{}, errors.New("HTTP 503"))
	// Scan every 100 ms for 60 s: asked at backoffs 1,2,4,8,8,... each
	// drawn from [d/2, d): between 60/8 and 60/0.5+1 times, and the gaps
	// never shorter than half the backoff.
	var at []time.Time
	for range 600 {
		before := src.count("op-slow")
		e.RunResolver(ctx)
		if src.count("op-slow") > before {
			at = append(at, clk.Now())
		}
		clk.Advance(100 * time.Millisecond)
	}
	if len(at) < 8 || len(at) > 20 {
		t.Fatalf("asked %d times in 60 s with backoff 1s..8s", len(at))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	for i := 1; i < len(at); i++ {
		d := 8 * time.Second
		if i-1 < len(want) {
			d = want[i-1]
		}
		gap := at[i].Sub(at[i-1])
		if gap < d/2 || gap > d+100*time.Millisecond {
			t.Fatalf("gap %d is %v, want within [%v, %v]", i, gap, d/2, d)
		}
	}
	if r := state(t, e, "slow"); r.State != ledger.StateUsageUnknown {
		t.Fatalf("5xx answers settled it: %s", r.State)
	}
}

func TestResolverAsksOldestMarkedFirst(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now,
		Resolver: &ResolverOptions{Source: src, PageSize: 1, MaxPages: 1, Concurrency: 1}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	unknownWork(t, e, clk, "c", "a", "b") // marked in this order
	for _, op := range []string{"op-a", "op-b", "op-c"} {
		src.set(op, OperationStatus{State: OperationRunning}, nil)
	}
	for range 3 {
		e.RunResolver(ctx)
	}
	if got := src.order; len(got) != 3 || got[0] != "op-c" || got[1] != "op-a" || got[2] != "op-b" {
		t.Fatalf("asked in order %v, want the marking order [op-c op-a op-b]", got)
	}
}

func TestResolverFlagsOverdueAndKeepsThemHeld(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now, Resolver: &ResolverOptions{
		Source:   src,
		Deadline: func(r *ledger.Reservation) time.Duration { return 10 * time.Minute },
	}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	unknownWork(t, e, clk, "old", "young")
	src.set("op-old", OperationStatus{State: OperationUnknown}, nil)
	src.set("op-young", OperationStatus{State: OperationRunning}, nil)
	if s := e.ResolverStats(); s.Scanned {
		t.Fatalf("scanned before a scan: %+v", s)
	}
	e.RunResolver(ctx)
	if s := e.ResolverStats(); !s.Scanned || s.Overdue != 0 {
		t.Fatalf("nothing is overdue yet: %+v", s)
	}
	clk.Advance(10*time.Minute - 1500*time.Millisecond) // old marked 2 s, young 1 s before the advance
	e.RunResolver(ctx)
	old, young := state(t, e, "old"), state(t, e, "young")
	if s := e.ResolverStats(); s.Overdue != 1 || !e.UnknownOverdue(&old, clk.Now()) || e.UnknownOverdue(&young, clk.Now()) {
		t.Fatalf("one past its deadline: %+v", s)
	}
	// The deadline's own instant is past it; a nanosecond before is not.
	if at := young.UnknownAt.Add(10 * time.Minute); !e.UnknownOverdue(&young, at) || e.UnknownOverdue(&young, at.Add(-time.Nanosecond)) {
		t.Fatalf("at its deadline %s: overdue %v; a nanosecond before: %v", at, e.UnknownOverdue(&young, at), e.UnknownOverdue(&young, at.Add(-time.Nanosecond)))
	}
	clk.Advance(time.Hour)
	e.RunResolver(ctx)
	if s := e.ResolverStats(); s.Overdue != 2 {
		t.Fatalf("both past: %+v", s)
	}
	if reserved, _ := reservedTokens(t, e); reserved != 600 {
		t.Fatalf("overdue work refunded: reserved %d, want 600", reserved)
	}
	// A receipt still settles an overdue reservation.
	src.set("op-old", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 10}}, nil)
	clk.Advance(2 * time.Minute)
	e.RunResolver(ctx)
	e.RunResolver(ctx) // a full pass after the settle
	if s := e.ResolverStats(); s.Overdue != 1 || s.Settled != 1 {
		t.Fatalf("after the late receipt: %+v", s)
	}
	auditClean(t, e)
}

func TestResolverAndGatewaySettleOnce(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now, Resolver: &ResolverOptions{Source: src}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	unknownWork(t, e, clk, "same", "other")
	// The gateways settle first: one with the units the endpoint will
	// report, one with different units.
	for id, units := range map[string]int64{"same": 100, "other": 50} {
		if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{units}}); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	src.set("op-same", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 100}}, nil)
	src.set("op-other", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 70}}, nil)
	// The resolver read them as USAGE_UNKNOWN before they settled: feed
	// it that page directly.
	rows := []ledger.Reservation{state(t, e, "same"), state(t, e, "other")}
	for i := range rows {
		rows[i].State = ledger.StateUsageUnknown
	}
	e.resolver.page(ctx, rows, nil)
	e.resolver.Wait() // page hands the rows to their route's lane: wait for its settles
	if reserved, spent := reservedTokens(t, e); reserved != 0 || spent != 150 {
		t.Fatalf("reserved %d spent %d, want 0 and 150 (charged once)", reserved, spent)
	}
	if r := state(t, e, "other"); r.Actual[0] != 50 {
		t.Fatalf("the resolver's settle replaced the gateway's: %v", r.Actual[0])
	}
	auditClean(t, e)
}

func TestResolverAsksARouteAgainWhenItComesBack(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now,
		Resolver: &ResolverOptions{Source: src, MinBackoff: time.Second, MaxBackoff: time.Minute, Seed: 3}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	ids := []string{"a", "b", "c", "d"}
	unknownWork(t, e, clk, ids...)
	for _, id := range ids {
		src.set("op-"+id, OperationStatus{}, errors.New("connection refused"))
	}
	// Down for five minutes: every backoff has grown to [30 s, 60 s).
	for range 300 {
		e.RunResolver(ctx)
		clk.Advance(time.Second)
	}
	for _, id := range ids {
		src.set("op-"+id, OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 10}}, nil)
	}
	// Back up: the first answer makes the scan after it ask the others,
	// instead of each waiting out its own backoff.
	if first, last := scansToSettle(t, e, clk, ids); last > first+1 {
		t.Fatalf("first settled at scan %d, the last at %d: the others waited out their backoff", first, last)
	}
	auditClean(t, e)
}

// scansToSettle runs the resolver a scan a second until every one of ids
// is settled, and returns the scans at which the first and the last
// settled; it fails the test if they are not all settled within 70 scans.
func scansToSettle(t *testing.T, e *Engine, clk *clock, ids []string) (first, last int) {
	t.Helper()
	first = -1
	for s := range 70 {
		e.RunResolver(context.Background())
		settled := 0
		for _, id := range ids {
			if state(t, e, id).State == ledger.StateSettled {
				settled++
			}
		}
		if settled > 0 && first < 0 {
			first = s
		}
		if settled == len(ids) {
			return first, s
		}
		clk.Advance(time.Second)
	}
	t.Fatalf("not all settled within 70 s of coming back (first at scan %d)", first)
	return first, -1
}

// The out-of-turn question comes once per comeback of the route, not once
// per reservation: a reservation asked out of turn whose question failed
// (the route went down again at once) is asked out of turn again when the
// route comes back from the next outage. It used to be asked out of turn
// only once until it got an answer, so after the second outage it waited
// out a backoff that had grown to [30 s, 60 s).
func TestResolverAsksARouteAgainAfterEachOutage(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		clk := newClock()
		src := newScripted()
		e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now,
			Resolver: &ResolverOptions{Source: src, MinBackoff: time.Second, MaxBackoff: time.Minute, Seed: seed}})
		ctx := context.Background()
		publish(t, e, 10000, time.Minute, 30*time.Second)
		ids := []string{"a", "b", "c", "d"}
		unknownWork(t, e, clk, ids...)
		// The route's gateway: down (refused), up for one answer then
		// down again (a flap), or up.
		var mu sync.Mutex
		mode := "down"
		setMode := func(m string) { mu.Lock(); mode = m; mu.Unlock() }
		getMode := func() string { mu.Lock(); defer mu.Unlock(); return mode }
		for _, id := range ids {
			src.mu.Lock()
			src.answers["op-"+id] = func() (OperationStatus, error) {
				mu.Lock()
				defer mu.Unlock()
				switch mode {
				case "up":
					return OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 10}}, nil
				case "flap":
					mode = "down"
					return OperationStatus{State: OperationRunning}, nil
				}
				return OperationStatus{}, errors.New("connection refused")
			}
			src.mu.Unlock()
		}
		asked := func() (n int) {
			for _, id := range ids {
				n += src.count("op-" + id)
			}
			return n
		}
		scan := func() { e.RunResolver(ctx); clk.Advance(time.Second) }

		// Down for five minutes: every backoff has grown to [30 s, 60 s).
		for range 300 {
			scan()
		}
		// Up for one answer and down again: the scan after that answer
		// asks the three others out of turn, and each question fails.
		setMode("flap")
		for getMode() == "flap" {
			scan()
		}
		before := asked()
		scan()
		if n := asked() - before; n != len(ids)-1 {
			t.Fatalf("seed %d: %d questions at the scan after the route answered, want the %d others out of turn", seed, n, len(ids)-1)
		}
		// Down for five more minutes, then back for good: the first
		// answer makes the scan after it ask every other reservation.
		for range 300 {
			scan()
		}
		setMode("up")
		if first, last := scansToSettle(t, e, clk, ids); last > first+1 {
			t.Fatalf("seed %d: first settled at scan %d, the last at %d: the ones asked out of turn after the first outage waited out their backoff", seed, first, last)
		}
		auditClean(t, e)
		e.Close()
	}
}

// A reservation whose own questions keep failing the way a down route's
// do (a 5xx for its operation only) while the route answers the others
// is asked out of turn once until it gets an answer, not at every answer
// of its neighbours: only the failures of one reservation are no outage.
func TestResolverAsksOneFailingReservationOutOfTurnOnce(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now,
		Resolver: &ResolverOptions{Source: src, MinBackoff: time.Second, MaxBackoff: time.Minute, Seed: 11}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	ids := []string{"bad", "run-1", "run-2", "run-3"}
	unknownWork(t, e, clk, ids...)
	src.set("op-bad", OperationStatus{}, errors.New("HTTP 503"))
	for _, id := range ids[1:] {
		src.set("op-"+id, OperationStatus{State: OperationRunning}, nil)
	}
	var at []time.Time
	for range 16 * 60 {
		before := src.count("op-bad")
		e.RunResolver(ctx)
		if src.count("op-bad") > before {
			at = append(at, clk.Now())
		}
		clk.Advance(time.Second)
	}
	// Gap k follows the k-th failure: at least half of min(1s*2^(k-1), 1m).
	short := 0
	for k := 1; k < len(at); k++ {
		d := min(time.Second<<min(k-1, 6), time.Minute)
		if at[k].Sub(at[k-1]) < d/2 {
			short++
		}
	}
	if short > 1 {
		t.Fatalf("asked %d times in 16 min, %d gaps shorter than its backoff (running ones: %d)", len(at), short, src.count("op-run-1"))
	}
}

// Several reservations whose own questions keep failing the way a down
// route's do (a timeout for their operations only) while the route
// answers the others stay on their backoff: their failures together are
// no outage either. They used to be taken for one, and each answer of a
// neighbour, as its comeback, had them asked out of turn again.
func TestResolverKeepsSeveralFailingReservationsOnTheirBackoff(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		severalFailingStayOnBackoff(t, seed)
	}
}

func severalFailingStayOnBackoff(t *testing.T, seed uint64) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now,
		Resolver: &ResolverOptions{Source: src, MinBackoff: time.Second, MaxBackoff: time.Minute, Seed: seed}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	bad := []string{"bad-1", "bad-2", "bad-3", "bad-4"}
	ids := append([]string{"run-1", "run-2", "run-3", "run-4", "run-5"}, bad...)
	unknownWork(t, e, clk, ids...)
	for _, id := range ids {
		src.set("op-"+id, OperationStatus{State: OperationRunning}, nil)
	}
	for _, id := range bad {
		src.set("op-"+id, OperationStatus{}, context.DeadlineExceeded)
	}
	at := map[string][]time.Time{}
	for range 16 * 60 {
		before := map[string]int{}
		for _, id := range bad {
			before[id] = src.count("op-" + id)
		}
		e.RunResolver(ctx)
		for _, id := range bad {
			if src.count("op-"+id) > before[id] {
				at[id] = append(at[id], clk.Now())
			}
		}
		clk.Advance(time.Second)
	}
	// Gap k follows the k-th failure: at least half of min(1s*2^(k-1), 1m),
	// but for one early question.
	for _, id := range bad {
		short := 0
		for k := 1; k < len(at[id]); k++ {
			if d := min(time.Second<<min(k-1, 6), time.Minute); at[id][k].Sub(at[id][k-1]) < d/2 {
				short++
			}
		}
		if short > 1 {
			t.Errorf("seed %d: %s asked %d times in 16 min, %d gaps shorter than its backoff", seed, id, len(at[id]), short)
		}
	}
}

// An answer's units above ledger.MaxUnits are a bad answer: no settle is
// made of it; MaxUnits itself settles.
func TestResolverRefusesAnAnswerAboveMaxUnits(t *testing.T) {
	st := memstore.New()
	e := New(st, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	r := NewResolver(st, ResolverOptions{}, time.Now, nil, nil)
	row := ledger.Reservation{ID: "rl-1", OperationID: "op-1",
		Account: ledger.AccountKey{Subject: "tenant", Route: "chat.generate", Region: "eu", Generation: 1}}
	answer := func(n ledger.Units) OperationStatus {
		return OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": n}}
	}
	if cmd, err := r.settleCommand(context.Background(), &row, answer(ledger.MaxUnits+1), nil); err == nil {
		t.Fatalf("an answer of MaxUnits+1 tokens made %+v", cmd)
	}
	if cmd, err := r.settleCommand(context.Background(), &row, answer(ledger.MaxUnits), nil); err != nil || cmd.Units[0] != ledger.MaxUnits {
		t.Fatalf("an answer of MaxUnits tokens: %+v, %v", cmd, err)
	}
}

// The resolver learns that a route answers again only from an answer: a
// lone reservation whose endpoint comes back right after its question
// failed is asked next when its backoff runs out (at least MaxBackoff/2
// and at most MaxBackoff after that failure), not at the next scan. So a
// gateway that comes back after a long outage sees its records settled up
// to MaxBackoff later (docs/CLIENTS.md, docs/OPERATIONS.md, "The
// USAGE_UNKNOWN resolver").
func TestResolverSeesAComebackOnlyAtItsNextQuestion(t *testing.T) {
	clk := newClock()
	src := newScripted()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now,
		Resolver: &ResolverOptions{Source: src, MinBackoff: time.Second, MaxBackoff: 8 * time.Second, Seed: 11}})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 10000, time.Minute, 30*time.Second)
	unknownWork(t, e, clk, "lone")
	src.set("op-lone", OperationStatus{}, errors.New("connection refused"))
	// Down for 60 s, scanned every 100 ms: the backoff reaches 8 s.
	for range 600 {
		e.RunResolver(ctx)
		clk.Advance(100 * time.Millisecond)
	}
	// Wait for its next failed question, then come back at once.
	var failedAt time.Time
	for before := src.count("op-lone"); failedAt.IsZero(); clk.Advance(100 * time.Millisecond) {
		e.RunResolver(ctx)
		if src.count("op-lone") > before {
			failedAt = clk.Now()
		}
	}
	src.set("op-lone", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 10}}, nil)
	var askedAt time.Time
	for before := src.count("op-lone"); askedAt.IsZero(); clk.Advance(100 * time.Millisecond) {
		if clk.Now().Sub(failedAt) > time.Minute {
			t.Fatal("not asked again within a minute of its failed question")
		}
		e.RunResolver(ctx)
		if src.count("op-lone") > before {
			askedAt = clk.Now()
		}
	}
	if gap := askedAt.Sub(failedAt); gap < 4*time.Second || gap > 8*time.Second+100*time.Millisecond {
		t.Fatalf("asked %v after its failed question, the endpoint back since: want its backoff, [4s, 8s]", gap)
	}
	if r := state(t, e, "lone"); r.State != ledger.StateSettled {
		t.Fatalf("the answer after the comeback did not settle it: %s", r.State)
	}
	auditClean(t, e)
}
