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
// other case without one): g1 (tokens refilled, images) spends its tokens
// and owes an image, which g2 does not limit; g2 limits tokens with refill
// 0. A reserve of tokens while the subject is frozen waits, after the
// switch, on g2's refill, which mints nothing: no Retry-After, and the
// message says that generation 2 refills no tokens.
func TestOwingFrozenRefusalSaysTheDecidingGenerationRefillsNothing(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(
		ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500},
		ledger.Dimension{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}))
	c.must(c.reserve("work", 1000, 1))
	c.must(c.start("work"))
	c.must(c.settle("work", 1000, 3))
	g2 := c.publish(policyOf(ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 0, RefillInterval: time.Second, MaxOverdraft: 500}))

	res := c.reserve("x", 500)
	if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Generation != g2 || res.RetryAfter != 0 {
		t.Fatalf("reserve of 500 tokens while g1 owes an image: %v (generation %d, retry after %s); want %v under generation %d without a Retry-After",
			res.Err, res.Generation, res.RetryAfter, ledger.ErrAdmissionFrozen, g2)
	}
	want := "generation " + strconv.FormatUint(g2, 10) + " refills no tokens (refillUnits 0), so no Retry-After is given"
	if !strings.Contains(res.Err.Error(), want) || res.Dimension != "tokens" {
		t.Fatalf("refusal without a Retry-After: %v (dimension %q); want it to say %q, dimension tokens", res.Err, res.Dimension, want)
	}
}

// The same when the current account's generation refills the unit with
// refillUnits 0 (and the deciding one refills it): the frozen subject's
// wait for tokens is reckoned on the current account, whose refill mints
// none, so no Retry-After, and the message names generation 1.
func TestOwingFrozenRefusalSaysTheCurrentGenerationRefillsNothing(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(
		ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 0, RefillInterval: time.Second, MaxOverdraft: 500},
		ledger.Dimension{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}))
	c.must(c.reserve("work", 1000, 1))
	c.must(c.start("work"))
	c.must(c.settle("work", 1000, 3))
	g2 := c.publish(policyOf(ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 10, RefillInterval: time.Second, MaxOverdraft: 500}))

	res := c.reserve("x", 500)
	if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Generation != g2 || res.RetryAfter != 0 {
		t.Fatalf("reserve of 500 tokens while g1 owes an image: %v (generation %d, retry after %s); want %v under generation %d without a Retry-After",
			res.Err, res.Generation, res.RetryAfter, ledger.ErrAdmissionFrozen, g2)
	}
	want := "generation " + strconv.FormatUint(g1, 10) + " refills no tokens (refillUnits 0), so no Retry-After is given"
	if !strings.Contains(res.Err.Error(), want) || res.Dimension != "tokens" {
		t.Fatalf("refusal without a Retry-After: %v (dimension %q); want it to say %q, dimension tokens", res.Err, res.Dimension, want)
	}
}
