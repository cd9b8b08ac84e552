package ledger_test

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// TestOwingExplore walks random histories of one subject over three
// units (exploreDims; every generation a random subset with the same
// terms per unit): publishes, rollbacks, reserves, late settles above
// the hold, releases, records, drains, refills, and legacy budgets carved
// and reconciled (used beyond them too). Besides the harness's
// checks after every command (audit, step, held elsewhere) it checks
// after each step that the capacity created for the subject in each unit
// (openings and refill mints) stays within one bucket's (burst + refill
// for the time since the unit was first opened), and that the subject's
// holds in a unit no generation left behind stay within its burst. With
// EXPLORE_RETRY set it also retries each refusal with a Retry-After in a
// replay after the wait and reports a second refusal (docs/API.md,
// Retry-After: nothing else happening, the retry is admitted); with
// EXPLORE_RETRY=wait it checks that first, then, in another replay, lands
// a command during the wait (exploreProbe) and checks the weaker promise
// of docs/ROLLOUT.md, Limitations: a retry after the Retry-After is
// refused again only when that command handed the subject's capacity over,
// and one refill interval later it is admitted. EXPLORE_SEEDS sets the number of
// histories (600 by default), EXPLORE_FROM the first seed (0 by
// default); EXPLORE_DUMP=<seed> logs that history, cut down to the steps
// that keep the failure.
func TestOwingExplore(t *testing.T) {
	seeds, _ := strconv.Atoi(os.Getenv("EXPLORE_SEEDS"))
	if seeds == 0 {
		seeds = 600
	}
	from, _ := strconv.Atoi(os.Getenv("EXPLORE_FROM"))
	retry := retryOff
	switch os.Getenv("EXPLORE_RETRY") {
	case "":
	case "wait":
		retry = retryWait
	default:
		retry = retryAlone
	}
	found := map[string]int{}
	for seed := from; seed < seeds; seed++ {
		if msg, steps := exploreSeed(seed, retry); msg != "" {
			key := msg
			if i := strings.IndexAny(key, "0123456789"); i > 0 {
				key = key[:i]
			}
			found[key]++
			if found[key] <= 2 {
				t.Errorf("seed %d: %s", seed, msg)
			}
			if os.Getenv("EXPLORE_DUMP") == strconv.Itoa(seed) {
				if strings.HasPrefix(msg, "retry-after") {
					steps = minimizeRetry(steps)
				} else {
					steps = minimizeMint(steps, key)
				}
				for _, s := range steps {
					if s.cmd.Kind == 0 {
						t.Logf("  advance %v", s.advance)
						continue
					}
					t.Logf("  %s %s %v (after %v)", s.desc, s.cmd.ReservationID, s.cmd.Units[:3], s.advance)
					if s.cmd.Shard != nil && len(s.cmd.Shard.Receipts) > 0 {
						t.Logf("    receipt %+v", s.cmd.Shard.Receipts[0])
					}
				}
			}
		}
	}
	t.Logf("legacy budgets carved %d, reconciliations tried %d, holds expired %d", exploreCarved, exploreReconciled, exploreExpired)
	if retry == retryWait {
		t.Logf("retries with a command during the wait %d, refused at the Retry-After %d (each after a handover, admitted one refill interval later)", exploreProbed, exploreProbeShort)
	}
	if len(found) > 0 {
		t.Logf("failures by kind: %v", found)
	}
}

// exploreCarved and exploreReconciled count the walks' legacy steps;
// exploreProbed the retries checked with a command during the wait
// (EXPLORE_RETRY=wait), exploreProbeShort those refused at the
// Retry-After; exploreExpired the holds expired (EXPLORE_EXPIRY).
var exploreCarved, exploreReconciled, exploreProbed, exploreProbeShort, exploreExpired int

// retryMode is what a walk checks of a refusal's Retry-After
// (EXPLORE_RETRY): nothing, the retry after it with nothing else
// happening, or that and the retry with a command during the wait.
type retryMode int

const (
	retryOff retryMode = iota
	retryAlone
	retryWait
)

// panicFailer fails by panicking, so a walk's failure is recovered and
// reported with its seed.
type panicFailer struct{}

func (panicFailer) Helper()                           {}
func (panicFailer) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (panicFailer) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// exploreStep is one step of a walk: a command, or time passing.
type exploreStep struct {
	cmd     ledger.Command
	advance time.Duration
	desc    string
}

// exploreDims are the walk's units, each with the same terms in every
// generation that limits it.
var exploreDims = []ledger.Dimension{
	{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500},
	{Unit: "requests", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5},
	{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5},
}

// exploreReplay applies steps to a fresh harness that fails by panicking.
func exploreReplay(steps []exploreStep) *checked {
	c := &checked{t: panicFailer{}}
	sb := newStoreBook()
	c.m, c.book, c.now, c.prev = sb.m, sb, t0, sb.m.Snapshot()
	for _, s := range steps {
		c.advance(s.advance)
		if s.cmd.Kind != 0 {
			c.apply(s.cmd)
		}
	}
	return c
}

// mintBound returns, for the first unit where one is broken, which of two
// bounds of one bucket is: the capacity created for the subject (openings
// and refill mints in the journal) within burst + refill for the time
// since the unit was first opened, and, in a unit no generation left
// behind (the documented gap of HeldElsewhere), the subject's holds
// within the burst; "" when both hold.
func mintBound(c *checked) string {
	for _, d := range exploreDims {
		var first time.Time
		var fresh ledger.Units
		for _, e := range c.m.Journal {
			p, ok := c.m.Policy(e.Account.Generation)
			if !ok {
				continue
			}
			i := p.DimensionIndex(d.Unit)
			if i < 0 {
				continue
			}
			if e.ReceiptID == "open" && first.IsZero() {
				first = e.At
			}
			fresh += e.Delta[i].Opening
			if e.Kind == ledger.KindRefill {
				fresh += e.Delta[i].Minted
			}
		}
		if first.IsZero() {
			continue
		}
		if c.m.Meta(ledger.MetaLeftBehind(testSubject, d.Unit)) == 0 {
			var held ledger.Units
			for _, a := range c.m.Accounts() {
				if p, ok := c.m.Policy(a.Key.Generation); ok {
					if i := p.DimensionIndex(d.Unit); i >= 0 {
						held += a.Balances[i].Reserved
					}
				}
			}
			if held > d.Burst {
				return fmt.Sprintf("%s: %d held on a burst of %d", d.Unit, held, d.Burst)
			}
		}
		bound := d.Burst + d.RefillUnits*ledger.Units(c.now.Sub(first)/d.RefillInterval)
		if fresh > bound {
			return fmt.Sprintf("%s: %d created, one bucket allows %d", d.Unit, fresh, bound)
		}
	}
	return ""
}

// exploreSeed walks the history of seed; it returns the first failure
// ("" for none) and the steps taken.
func exploreSeed(seed int, retry retryMode) (string, []exploreStep) {
	rng := &splitmix{state: uint64(seed)*0x9e3779b97f4a7c15 + 7}
	var steps []exploreStep
	var ids []string
	var gens []uint64
	var budgets []string
	msg := func() (msg string) {
		defer func() {
			if r := recover(); r != nil {
				msg = fmt.Sprint(r)
			}
		}()
		c := exploreReplay(nil)
		do := func(s exploreStep) ledger.Result {
			steps = append(steps, s)
			c.advance(s.advance)
			if s.cmd.Kind == 0 {
				return ledger.Result{}
			}
			res := c.apply(s.cmd)
			if exploreReplayEach {
				exploreCheckReplay(c, s.cmd, res)
			}
			return res
		}
		n := 10 + rng.IntN(40)
		for step := 0; step < n; step++ {
			if exploreExpiry && len(ids) > 0 && rng.IntN(6) == 0 {
				// A hold running out (the expiry worker's two commands)
				// or started work marked USAGE_UNKNOWN, after time
				// enough for some holds to have run out.
				id := ids[rng.IntN(len(ids))]
				do(exploreStep{advance: time.Duration(rng.IntN(40)) * time.Second})
				if rng.IntN(3) == 0 {
					do(exploreStep{cmd: ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id, Cause: ledger.CauseRequest}, desc: "unknown " + id})
				} else {
					do(exploreStep{cmd: ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: id, Cause: ledger.CauseHoldExpired}, desc: "expire claim " + id})
					if do(exploreStep{cmd: ledger.Command{Kind: ledger.KindExpire, ReservationID: id, Cause: ledger.CauseHoldExpired}, desc: "expire " + id}).Err == nil {
						exploreExpired++
					}
				}
				if m := mintBound(c); m != "" && !exploreVary {
					panic("mint bound: " + m)
				}
				continue
			}
			switch k := rng.IntN(20); {
			case k < 3 || len(gens) == 0:
				var dims []ledger.Dimension
				for i, d := range exploreDims {
					if i == 0 && rng.IntN(6) > 0 || i > 0 && rng.IntN(2) == 0 {
						dims = append(dims, exploreTerms(d, rng))
					}
				}
				if len(dims) == 0 {
					dims = append(dims, exploreDims[0])
				}
				p := ledger.Policy{Key: testSubject, Dimensions: dims, HoldTTL: time.Duration(30+step) * time.Second}.WithDefaults()
				res := do(exploreStep{cmd: ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}, desc: fmt.Sprint("publish ", units(dims))})
				if res.Err == nil {
					gens = append(gens, res.Generation)
				}
			case k < 4:
				g := gens[rng.IntN(len(gens))]
				do(exploreStep{cmd: ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: testSubject, Generation: g}, desc: fmt.Sprint("rollback ", g)})
			case k < 9:
				id := fmt.Sprintf("r%d", step)
				a := shaped(c, rng, 600, 3)
				cmd := ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: a}
				res := do(exploreStep{cmd: cmd, desc: "reserve"})
				if res.Err == nil {
					ids = append(ids, id)
					continue
				}
				if retry != retryOff && res.RetryAfter > 0 && (errors.Is(res.Err, ledger.ErrAdmissionFrozen) || errors.Is(res.Err, ledger.ErrInsufficientCapacity)) {
					fork := exploreReplay(steps)
					fork.advance(res.RetryAfter)
					cmd2 := cmd
					cmd2.ReservationID += "-retry"
					cmd2.RequestDigest += "-retry"
					// A failure of the retry itself is the walk's, with
					// the retry as its last step.
					steps = append(steps, exploreStep{cmd: cmd2, advance: res.RetryAfter, desc: "retry"})
					again := fork.apply(cmd2)
					steps = steps[:len(steps)-1]
					if again.Err != nil && !errors.Is(again.Err, ledger.ErrReservationTooLarge) {
						panic(fmt.Sprintf("retry-after: refused %v (%s %v); retry after it: %v (%s %v)", res.Err, res.Dimension, res.RetryAfter, again.Err, again.Dimension, again.RetryAfter))
					}
					if retry == retryWait {
						exploreRetryBesideProbe(steps, seed, step, cmd, res)
					}
				}
			case k < 11 && len(ids) > 0:
				id := ids[rng.IntN(len(ids))]
				do(exploreStep{cmd: ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id}, desc: "start " + id})
			case k < 14 && len(ids) > 0:
				id := ids[rng.IntN(len(ids))]
				a := shapedFor(c, id, rng, 900, 6)
				do(exploreStep{cmd: ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: a}, desc: "settle " + id})
			case k < 15 && len(ids) > 0:
				id := ids[rng.IntN(len(ids))]
				do(exploreStep{cmd: ledger.Command{Kind: ledger.KindRelease, ReservationID: id}, desc: "release " + id})
			case k < 16:
				g := gens[rng.IntN(len(gens))]
				key := ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: g}
				kind := ledger.KindDrain
				if rng.IntN(2) == 0 {
					kind = ledger.KindRefill
				}
				do(exploreStep{cmd: ledger.Command{Kind: kind, Account: key}, desc: fmt.Sprint(kind, g)})
			case k < 17:
				id := fmt.Sprintf("rec%d", step)
				a := shaped(c, rng, 300, 3)
				do(exploreStep{cmd: ledger.Command{Kind: ledger.KindRecord, ReservationID: id, RequestDigest: "rec-" + id, OperationID: "op-" + id,
					Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: a}, desc: "record"})
			case k < 18:
				id := fmt.Sprintf("lb%d", step)
				res := do(exploreStep{cmd: ledger.Command{Kind: ledger.KindShardIssue, Subject: testSubject.Subject, Route: testSubject.Route,
					Region: testSubject.Region, Units: shaped(c, rng, 300, 2),
					Shard: &ledger.ShardArgs{ShardID: id, GatewayID: ledger.LegacyGateway("old"), BootEpoch: 1, TTL: time.Hour,
						KeyID: "k1", Sign: ledger.Ed25519ShardSigner(shardKey), Legacy: true}}, desc: "carve " + id})
				if res.Err == nil {
					budgets = append(budgets, id)
					exploreCarved++
				}
			case k < 19 && len(budgets) > 0:
				id := budgets[rng.IntN(len(budgets))]
				sh, ok := c.m.Shard(id)
				if !ok {
					continue
				}
				var actual ledger.Amounts
				for i := range actual {
					actual[i] = rng.Int64N(sh.Allocated[i]*3/2 + 1)
				}
				actual[0]++
				state := ledger.StateSettled
				if actual[0] > sh.Allocated[0] || actual[1] > sh.Allocated[1] || actual[2] > sh.Allocated[2] {
					state = ledger.StateSettledWithDebt
				}
				receipts := []ledger.ShardReceipt{{ReservationID: "u-" + id, State: state, Reserved: sh.Allocated, Actual: actual}}
				exploreReconciled++
				do(exploreStep{cmd: ledger.Command{Kind: ledger.KindShardReconcile,
					Shard: &ledger.ShardArgs{ShardID: id, GatewayID: ledger.LegacyGateway("old"), Receipts: receipts}}, desc: "reconcile " + id})
			default:
				do(exploreStep{advance: time.Duration(rng.IntN(4000)) * time.Millisecond})
			}
			if m := mintBound(c); m != "" && !exploreVary {
				panic("mint bound: " + m)
			}
		}
		return ""
	}()
	return msg, steps
}

// units names dims' units.
func units(dims []ledger.Dimension) []string {
	var out []string
	for _, d := range dims {
		if exploreVary {
			out = append(out, fmt.Sprintf("%s(burst %d, %d per %v)", d.Unit, d.Burst, d.RefillUnits, d.RefillInterval))
			continue
		}
		out = append(out, d.Unit)
	}
	return out
}

// shaped draws units in the deciding policy's dimensions.
func shaped(c *checked, rng *splitmix, tok, other int64) ledger.Amounts {
	var a ledger.Amounts
	p, ok := ledger.ActivePolicy(c.book, testSubject)
	if !ok {
		return a
	}
	a = drawUnits(p, rng, tok, other)
	if a == (ledger.Amounts{}) {
		a[0] = 1
	}
	return a
}

// shapedFor draws settle units in the dimensions of the reservation's own policy.
func shapedFor(c *checked, id string, rng *splitmix, tok, other int64) ledger.Amounts {
	var a ledger.Amounts
	r, ok := c.m.Reservation(id)
	if !ok {
		return a
	}
	p, ok := c.m.Policy(r.Account.Generation)
	if !ok {
		return a
	}
	return drawUnits(p, rng, tok, other)
}

// drawUnits draws an amount in each of p's dimensions: below tok in
// tokens, below other in any other unit.
func drawUnits(p *ledger.Policy, rng *splitmix, tok, other int64) ledger.Amounts {
	var a ledger.Amounts
	for i, d := range p.Dimensions {
		if d.Unit == "tokens" {
			a[i] = rng.Int64N(tok)
		} else {
			a[i] = rng.Int64N(other)
		}
	}
	return a
}

// retryBroken reports whether the last step of steps, a reserve, is
// refused with a Retry-After after which the same request is refused again.
func retryBroken(steps []exploreStep) (broken bool) {
	defer func() {
		if r := recover(); r != nil {
			broken = false
		}
	}()
	last := steps[len(steps)-1]
	if last.cmd.Kind != ledger.KindReserve {
		return false
	}
	c := exploreReplay(steps[:len(steps)-1])
	c.advance(last.advance)
	res := c.apply(last.cmd)
	if res.Err == nil || res.RetryAfter == 0 {
		return false
	}
	c.advance(res.RetryAfter)
	cmd2 := last.cmd
	cmd2.ReservationID += "-retry"
	cmd2.RequestDigest += "-retry"
	again := c.apply(cmd2)
	return again.Err != nil && !errors.Is(again.Err, ledger.ErrReservationTooLarge)
}

// minimizeRetry drops steps (but the last) while retryBroken holds.
func minimizeRetry(steps []exploreStep) []exploreStep {
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(steps)-1; i++ {
			try := append(append([]exploreStep{}, steps[:i]...), steps[i+1:]...)
			if retryBroken(try) {
				steps, changed = try, true
				i--
			}
		}
	}
	return steps
}

// mintBroken reports whether replaying steps fails with a message that
// begins with key.
func mintBroken(steps []exploreStep, key string) (broken bool) {
	defer func() {
		if r := recover(); r != nil {
			broken = strings.HasPrefix(fmt.Sprint(r), key)
		}
	}()
	c := exploreReplay(nil)
	for _, s := range steps {
		c.advance(s.advance)
		if s.cmd.Kind != 0 {
			c.apply(s.cmd)
		}
		if m := mintBound(c); m != "" {
			panic("mint bound: " + m)
		}
	}
	return false
}

// minimizeMint drops steps while mintBroken holds.
func minimizeMint(steps []exploreStep, key string) []exploreStep {
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(steps); i++ {
			try := append(append([]exploreStep{}, steps[:i]...), steps[i+1:]...)
			if mintBroken(try, key) {
				steps, changed = try, true
				i--
			}
		}
	}
	return steps
}

// exploreRetryBesideProbe checks the Retry-After of res, the refusal of
// cmd (the last of steps), when another command lands during the wait:
// in a replay it applies, at a time drawn within the wait, a command
// that takes no capacity (exploreProbe), then retries cmd at the
// Retry-After. docs/ROLLOUT.md, Limitations: each handover of the
// subject's capacity loses the refill the previous account had accrued
// but not minted, less than one refill interval, so such a retry may be
// refused again, but only when the command moved the subject's current
// pointer, and a retry one refill interval later is admitted. A probe
// that is itself admitted took the capacity (nothing is promised then).
// It panics with the failure, the probe and the retry as the walk's last
// steps.
func exploreRetryBesideProbe(steps []exploreStep, seed, step int, cmd ledger.Command, res ledger.Result) {
	rng := &splitmix{state: uint64(seed)*0x9e3779b97f4a7c15 + uint64(step)*0xbf58476d1ce4e5b9 + 11}
	fork := exploreReplay(steps)
	before, _ := fork.book.AccountCurrent(testSubject)
	at := time.Duration(rng.Int64N(int64(res.RetryAfter/time.Millisecond))) * time.Millisecond
	fork.advance(at)
	probe, desc := exploreProbe(fork, rng, cmd)
	probed := fork.apply(probe)
	if probe.Kind == ledger.KindReserve && probed.Err == nil {
		return
	}
	after, _ := fork.book.AccountCurrent(testSubject)
	exploreProbed++
	fork.advance(res.RetryAfter - at)
	retry := cmd
	retry.ReservationID += "-retry"
	retry.RequestDigest += "-retry"
	again := fork.apply(retry)
	if again.Err == nil || errors.Is(again.Err, ledger.ErrReservationTooLarge) {
		return
	}
	exploreProbeShort++
	if before == after {
		panic(fmt.Sprintf("retry-after beside %s at %v: refused %v (%s %v); retry after it: %v (%s %v), with no handover (current generation %d throughout)",
			desc, at, res.Err, res.Dimension, res.RetryAfter, again.Err, again.Dimension, again.RetryAfter, before))
	}
	var interval time.Duration
	for _, p := range fork.m.Snapshot().Policies {
		for _, d := range p.Dimensions {
			interval = max(interval, d.RefillInterval)
		}
	}
	fork.advance(interval)
	late := cmd
	late.ReservationID += "-late"
	late.RequestDigest += "-late"
	if last := fork.apply(late); last.Err != nil && !errors.Is(last.Err, ledger.ErrReservationTooLarge) {
		panic(fmt.Sprintf("retry-after beside %s at %v (a handover, current generation %d then %d): refused %v (%s %v); retry after it: %v (%s %v); one refill interval later: %v (%s %v)",
			desc, at, before, after, res.Err, res.Dimension, res.RetryAfter, again.Err, again.Dimension, again.RetryAfter, last.Err, last.Dimension, last.RetryAfter))
	}
}

// exploreProbe draws a command that takes no capacity for c's subject,
// to land during a Retry-After's wait: cmd again under another id (a
// second gateway retrying early), a refill or a drain of one of the
// subject's accounts (the workers' commands), or a release of one of its
// holds (which only gives capacity back); with a description.
func exploreProbe(c *checked, rng *splitmix, cmd ledger.Command) (ledger.Command, string) {
	var gens []uint64
	var holds []string
	for _, a := range c.m.Accounts() {
		if a.Key.SubjectKey() == testSubject {
			gens = append(gens, a.Key.Generation)
		}
	}
	for _, r := range c.m.Reservations() {
		if r.State == ledger.StateReserved {
			holds = append(holds, r.ID)
		}
	}
	switch k := rng.IntN(4); {
	case k == 1 && len(gens) > 0, k == 2 && len(gens) > 0:
		key := ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: gens[rng.IntN(len(gens))]}
		kind := ledger.KindRefill
		if k == 2 {
			kind = ledger.KindDrain
		}
		return ledger.Command{Kind: kind, Account: key}, fmt.Sprint(kind, key.Generation)
	case k == 3 && len(holds) > 0:
		id := holds[rng.IntN(len(holds))]
		return ledger.Command{Kind: ledger.KindRelease, ReservationID: id}, "release " + id
	}
	early := cmd
	early.ReservationID += "-early"
	early.RequestDigest += "-early"
	return early, "an early retry"
}

// exploreVary (EXPLORE_TERMS=vary) draws each published generation's
// burst and refill per unit (exploreTerms) instead of one set of terms
// per unit; the one-bucket bound (mintBound) assumes one set, so it is
// not checked then. exploreExpiry (EXPLORE_EXPIRY=1) adds holds running
// out and started work marked USAGE_UNKNOWN. exploreReplayEach (EXPLORE_REPLAY=1) applies every
// command a second time at once, as a gateway retrying a lost answer
// does (exploreCheckReplay).
var (
	exploreVary       = os.Getenv("EXPLORE_TERMS") == "vary"
	exploreReplayEach = os.Getenv("EXPLORE_REPLAY") != ""
	exploreExpiry     = os.Getenv("EXPLORE_EXPIRY") != ""
)

// exploreTerms returns d, or with EXPLORE_TERMS=vary d with a burst and a
// refill drawn around its own.
func exploreTerms(d ledger.Dimension, rng *splitmix) ledger.Dimension {
	if !exploreVary {
		return d
	}
	d.Burst = d.Burst/2 + rng.Int64N(d.Burst+1)
	if d.Burst < 1 {
		d.Burst = 1
	}
	d.RefillUnits = 1 + rng.Int64N(2*d.RefillUnits)
	d.RefillInterval = time.Duration(1+rng.IntN(3)) * d.RefillInterval
	return d
}

// exploreCheckReplay applies cmd, applied a moment ago with answer res, a
// second time at the same time: a command that names a reservation (or
// a shard's receipts) is idempotent, so the replay must leave every
// account, reservation and move as they were, and an admitted reserve
// answers with the same receipt.
func exploreCheckReplay(c *checked, cmd ledger.Command, res ledger.Result) {
	switch cmd.Kind {
	case ledger.KindReserve, ledger.KindStart, ledger.KindSettle, ledger.KindRelease, ledger.KindRecord, ledger.KindShardReconcile,
		ledger.KindExpireClaim, ledger.KindExpire, ledger.KindMarkUsageUnknown:
	default:
		return
	}
	before := c.m.Snapshot()
	again := c.apply(cmd)
	after := c.m.Snapshot()
	if cmd.Kind == ledger.KindReserve && res.Err == nil && (again.Err != nil || again.Generation != res.Generation) {
		panic(fmt.Sprintf("replay of admitted reserve %s: %v (generation %d, first %d)", cmd.ReservationID, again.Err, again.Generation, res.Generation))
	}
	if res.Err != nil {
		return // a refusal may bring accounts to now, but it is one at the same time
	}
	if d := snapshotDiff(before, after); d != "" {
		panic(fmt.Sprintf("replay of %s %q changed the ledger: %s", cmd.Kind, cmd.ReservationID, d))
	}
}

// snapshotDiff names the first account, reservation or move that differs
// between two snapshots; "" when none does.
func snapshotDiff(a, b *ledger.Snapshot) string {
	if len(a.Accounts) != len(b.Accounts) || len(a.Reservations) != len(b.Reservations) || len(a.Moves) != len(b.Moves) {
		return fmt.Sprintf("%d/%d/%d accounts/reservations/moves, then %d/%d/%d",
			len(a.Accounts), len(a.Reservations), len(a.Moves), len(b.Accounts), len(b.Reservations), len(b.Moves))
	}
	for i := range a.Accounts {
		if a.Accounts[i].Balances != b.Accounts[i].Balances {
			return fmt.Sprintf("account %s: %+v, then %+v", a.Accounts[i].Key, a.Accounts[i].Balances, b.Accounts[i].Balances)
		}
	}
	return ""
}
