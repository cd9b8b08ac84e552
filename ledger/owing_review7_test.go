package ledger_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Promise (docs/API.md Retry-After: "if nothing else happens on the
// account, the same request retried after it is admitted"; docs/ROLLOUT.md
// Limitations: a request that fits only a larger burst of the deciding
// generation gets no Retry-After while the subject is frozen), as the walk
// met it with terms drawn per generation (EXPLORE_TERMS=vary
// EXPLORE_RETRY=1, seeds 21, 210, 289, ...): g1 limits requests (burst 1,
// 1 per 2 s) and images; a legacy budget holds an image, and work under g1
// settles 3 images on a hold of 1 after g2 (requests, burst 2, 1 per 3 s)
// is published, so g1, current, owes an image g2 does not limit. A
// reserve of 2 requests fits g2's burst but never g1's, where the subject
// refills until the switch: reckoned on g1's refill (2 s) the retry was
// refused again, as the switch moved g1's one request to g2, which then
// refilled the other at its own rate (3 s more).
func TestOwingReview7NoRetryAfterBeyondTheCurrentBurst(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(
		ledger.Dimension{Unit: "requests", Burst: 1, RefillUnits: 1, RefillInterval: 2 * time.Second, MaxOverdraft: 5},
		ledger.Dimension{Unit: "images", Burst: 3, RefillUnits: 1, RefillInterval: 2 * time.Second, MaxOverdraft: 5}))
	c.must(c.reserve("work", 1, 1))
	c.must(c.start("work"))
	c.must(c.apply(ledger.Command{Kind: ledger.KindShardIssue, Subject: testSubject.Subject, Route: testSubject.Route,
		Region: testSubject.Region, Units: ledger.Amounts{0, 1},
		Shard: &ledger.ShardArgs{ShardID: "lb", GatewayID: ledger.LegacyGateway("old"), BootEpoch: 1, TTL: time.Hour,
			KeyID: "k1", Sign: ledger.Ed25519ShardSigner(shardKey), Legacy: true}}))
	g2 := c.publish(policyOf(ledger.Dimension{Unit: "requests", Burst: 2, RefillUnits: 1, RefillInterval: 3 * time.Second, MaxOverdraft: 5}))
	c.must(c.settle("work", 0, 3))

	first := c.reserve("two", 2)
	if !errors.Is(first.Err, ledger.ErrAdmissionFrozen) || first.Generation != g2 {
		t.Fatalf("reserve of 2 requests while g1 owes an image: %v (generation %d); want %v under generation %d", first.Err, first.Generation, ledger.ErrAdmissionFrozen, g2)
	}
	if first.RetryAfter == 0 {
		// No promise made: the documented answer, which says why.
		if want := "the estimate of requests fits only the burst of generation " + strconv.FormatUint(g2, 10); !strings.Contains(first.Err.Error(), want) {
			t.Fatalf("refusal without a Retry-After: %v; want it to say %q", first.Err, want)
		}
		return
	}
	c.advance(first.RetryAfter)
	if again := c.reserve("two-retry", 2); again.Err != nil {
		t.Fatalf("refused with Retry-After %s (%v, %s); the retry after it: %v (%s, retry after %s)",
			first.RetryAfter, first.Err, first.Dimension, again.Err, again.Dimension, again.RetryAfter)
	}
}

// Promise (docs/API.md Retry-After: a command that hands the subject's
// capacity to another of its accounts during the wait loses up to one
// refillInterval of refill, and one refillInterval after the Retry-After
// the retry is admitted), as the walk met it with terms drawn per
// generation (EXPLORE_TERMS=vary EXPLORE_RETRY=wait, seeds 208, 1089,
// ...): g1 (tokens at 100 a second, images) spends its tokens and owes an
// image, which g2 (tokens at 10 a second) does not limit. A reserve of 500
// tokens is refused for 5 s, reckoned on g1's refill; a second gateway's
// early retry at 2 s, once the image is repaid, switches the subject to
// g2 with 200 tokens, and g2 refills the rest at its own rate: reckoned
// on g1's terms alone the retry was refused for half a minute more.
func TestOwingReview7RetryAfterCountsTheDecidingRefill(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(
		ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500},
		ledger.Dimension{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}))
	c.must(c.reserve("work", 1000, 1))
	c.must(c.start("work"))
	c.must(c.settle("work", 1000, 3))
	g2 := c.publish(policyOf(ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 10, RefillInterval: time.Second, MaxOverdraft: 500}))

	first := c.reserve("x", 500)
	if !errors.Is(first.Err, ledger.ErrAdmissionFrozen) || first.Generation != g2 || first.RetryAfter == 0 {
		t.Fatalf("reserve of 500 tokens while g1 owes an image: %v (generation %d, retry after %s); want %v under generation %d with a Retry-After",
			first.Err, first.Generation, first.RetryAfter, ledger.ErrAdmissionFrozen, g2)
	}
	c.advance(2 * time.Second)
	early := c.reserve("x-early", 500) // another gateway, early: the subject switches to g2
	if early.Err == nil {
		return // admitted early: nothing was promised then
	}
	if current, _ := c.m.AccountCurrent(testSubject); current != g2 {
		t.Fatalf("after the image was repaid the subject's current generation is %d; want %d (the handover this test is about)", current, g2)
	}
	c.advance(first.RetryAfter - 2*time.Second + time.Second) // one refill interval after the Retry-After
	if again := c.reserve("x-retry", 500); again.Err != nil {
		t.Fatalf("refused with Retry-After %s (%v); after a handover at 2 s, the retry one refill interval after it: %v (%s, retry after %s)",
			first.RetryAfter, first.Err, again.Err, again.Dimension, again.RetryAfter)
	}
}
