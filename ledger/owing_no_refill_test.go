package ledger_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Promise (docs/API.md Retry-After: absent for a dimension whose policy
// mints nothing, refillUnits 0, and the message says why, as in every
// other case without one): g1 (tokens, images) spends its tokens and owes
// an image, which g2 does not limit, so the subject is frozen on g1 while
// g2 decides. A reserve of tokens then waits on a refill that mints
// nothing and gets no Retry-After, the message naming the generation
// whose refill that is:
//   - g2's, when g2 limits tokens with refill 0: after the switch the wait
//     is on g2's refill;
//   - g1's, when g1 refills tokens with 0 (and g2 refills them): the wait
//     is reckoned on the current account.
func TestOwingFrozenRefusalSaysWhichGenerationRefillsNothing(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		g1Refill, g2Refill     ledger.Units
		namesCurrentGeneration bool
	}{
		{name: "deciding generation refills nothing", g1Refill: 100, g2Refill: 0},
		{name: "current generation refills nothing", g1Refill: 0, g2Refill: 10, namesCurrentGeneration: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecked(t)
			g1 := c.publish(policyOf(
				ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: tc.g1Refill, RefillInterval: time.Second, MaxOverdraft: 500},
				ledger.Dimension{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}))
			c.must(c.reserve("work", 1000, 1))
			c.must(c.start("work"))
			c.must(c.settle("work", 1000, 3))
			g2 := c.publish(policyOf(ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: tc.g2Refill, RefillInterval: time.Second, MaxOverdraft: 500}))

			res := c.reserve("x", 500)
			if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Generation != g2 || res.RetryAfter != 0 {
				t.Fatalf("reserve of 500 tokens while g1 owes an image: %v (generation %d, retry after %s); want %v under generation %d without a Retry-After",
					res.Err, res.Generation, res.RetryAfter, ledger.ErrAdmissionFrozen, g2)
			}
			named := g2
			if tc.namesCurrentGeneration {
				named = g1
			}
			want := "generation " + strconv.FormatUint(named, 10) + " refills no tokens (refillUnits 0), so no Retry-After is given"
			if !strings.Contains(res.Err.Error(), want) || res.Dimension != "tokens" {
				t.Fatalf("refusal without a Retry-After: %v (dimension %q); want it to say %q, dimension tokens", res.Err, res.Dimension, want)
			}
		})
	}
}
