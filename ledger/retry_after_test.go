package ledger_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// A Retry-After is a promise (issue 13): whenever a rejection carries one
// and nothing else happens on the account, the same request retried after
// it fits. Random policies and histories (holds, started work, settles with
// overuse and debt, releases), then a probe; every rejection with a
// retry-after is retried after exactly that wait and must be admitted.
func TestRetryAfterIsAPromise(t *testing.T) {
	promised, withheld := 0, 0
	for seed := uint64(0); seed < 3000; seed++ {
		rng := &splitmix{state: seed*0x9e3779b97f4a7c15 + 13}
		c := newChecked(t)
		dims := []ledger.Dimension{{Unit: "tokens", Burst: 50 + rng.Int64N(200), RefillUnits: rng.Int64N(30),
			RefillInterval: time.Duration(1+rng.IntN(3)) * 500 * time.Millisecond, MaxOverdraft: 1000}}
		if rng.IntN(2) == 0 {
			dims = append(dims, ledger.Dimension{Unit: "requests", Burst: 1 + rng.Int64N(10), RefillUnits: rng.Int64N(3),
				RefillInterval: time.Second, MaxOverdraft: 10})
		}
		p := policyOf(dims...)
		p.HoldTTL = time.Hour // nothing expires: "nothing else happens"
		c.publish(p)
		draw := func() ledger.Amounts {
			var a ledger.Amounts
			for i, d := range dims {
				a[i] = rng.Int64N(d.Burst/2 + 1)
			}
			a[0] = max(a[0], 1)
			return a
		}
		var live []string
		for step := 0; step < rng.IntN(12); step++ {
			c.advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			id := fmt.Sprintf("h%d", step)
			switch k := rng.IntN(4); {
			case k < 2 || len(live) == 0:
				units := draw()
				if res := c.reserve(id, units[:len(dims)]...); res.Err == nil {
					live = append(live, id)
				}
			case k == 2:
				// Start and settle one, with overuse now and then (debt).
				r := live[0]
				live = live[1:]
				c.must(c.start(r))
				use := draw()
				if rng.IntN(3) == 0 {
					use[0] += rng.Int64N(300)
				}
				c.must(c.settle(r, use[:len(dims)]...))
			default:
				r := live[0]
				live = live[1:]
				if rng.IntN(2) == 0 {
					c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: r}))
				} else {
					c.must(c.start(r)) // started work holds its capacity
				}
			}
		}
		probe := draw()
		probe[0] = rng.Int64N(dims[0].Burst) + 1
		res := c.reserve("probe", probe[:len(dims)]...)
		if res.Err == nil || !res.Rejected() || errors.Is(res.Err, ledger.ErrReservationTooLarge) {
			continue
		}
		if res.RetryAfter == 0 {
			withheld++
			continue
		}
		promised++
		c.advance(res.RetryAfter)
		if again := c.reserve("probe", probe[:len(dims)]...); again.Err != nil {
			t.Fatalf("seed %d: rejected with Retry-After %v (%v); the same request after it: %v", seed, res.RetryAfter, res.Err, again.Err)
		}
	}
	t.Logf("%d promised, %d withheld", promised, withheld)
	if promised < 100 || withheld < 100 {
		t.Fatalf("only %d rejections with a retry-after and %d without: the test did not test much", promised, withheld)
	}
}

// splitmix is a seeded SplitMix64 source (the ledger's tests take
// randomness only from seeds: internal/archtest bars math/rand here).
type splitmix struct{ state uint64 }

func (r *splitmix) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Int64N and IntN return a value in [0, n) for n > 0.
func (r *splitmix) Int64N(n int64) int64 { return int64(r.next() % uint64(n)) }
func (r *splitmix) IntN(n int) int       { return int(r.next() % uint64(n)) }

// A wait a moment short of MaxRetryAfter rounds up to it. Rounding up to
// whole seconds added almost a second to the wait first, which overflowed
// for waits in the last second below the longest Duration: a reserve 100
// ms after the refill cursor under a refill interval of 9223372036s (the
// longest a policy takes) then got a negative retry-after, and over the
// API a 429 without Retry-After, as if refill could never make room.
func TestRetryAfterJustBelowTheLongestRoundsUpToIt(t *testing.T) {
	for _, late := range []time.Duration{time.Nanosecond, 100 * time.Millisecond, time.Second - time.Nanosecond} {
		c := newChecked(t)
		d := tokens(10, 1)
		d.RefillInterval = ledger.MaxRetryAfter
		c.publish(policyOf(d))
		c.must(c.reserve("all", 10))
		c.must(c.start("all"))
		c.must(c.settle("all", 10))
		c.advance(late)
		res := c.reserve("one", 1)
		if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.RetryAfter != ledger.MaxRetryAfter {
			t.Errorf("%v after the cursor, one interval of %v away: %v, retry-after %v, want %v",
				late, ledger.MaxRetryAfter, res.Err, res.RetryAfter, ledger.MaxRetryAfter)
		}
	}
}
