package ledger_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Promise (docs/API.md Retry-After: given only when a wait helps, and
// then the retry after it is admitted; ROLLOUT.md Limitations). g1
// (tokens, images) holds 210 tokens and owes 2 images when g2 (tokens
// only) is published: the subject stays frozen on g1 for 1 s. A reserve
// of 450 tokens fits g1's burst of 1,000 beside the holds, but not a
// burst of 500 beside them, which the switch to g2 counts: it gets no
// Retry-After (before, it got 1 s, and the retry after it was refused
// after the switch, only holds ending making room). Under a burst of
// 2,000 it gets the 1 s, and the retry after it is admitted.
func TestOwingRetryAfterCountsTheDecidingBurst(t *testing.T) {
	for _, burst := range []ledger.Units{500, 2000} {
		c := newChecked(t)
		c.publish(policyOf(exploreDims[0], exploreDims[2]))
		c.must(c.reserve("h", 200, 0))
		c.must(c.reserve("a", 10, 1))
		c.must(c.start("a"))
		tk := exploreDims[0]
		tk.Burst = burst
		c.publish(policyOf(tk))
		c.must(c.settle("a", 10, 3)) // g1 owes 2 images
		first := c.reserve("c", 450)
		if !errors.Is(first.Err, ledger.ErrAdmissionFrozen) {
			t.Fatalf("burst %d: a reserve while g1 owes images: %v, want admission frozen", burst, first.Err)
		}
		if burst == 500 {
			if first.RetryAfter != 0 || first.Dimension != "tokens" || !strings.Contains(first.Err.Error(), "only outstanding holds ending can make room in tokens") {
				t.Fatalf("burst %d: 450 tokens beside 210 held: %v (%s, retry after %s); want no Retry-After, limited by tokens", burst, first.Err, first.Dimension, first.RetryAfter)
			}
			c.advance(2 * time.Second) // the images are repaid: the subject switches
			if res := c.reserve("d", 450); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.RetryAfter != 0 {
				t.Fatalf("burst %d: after the switch: %v, retry after %s; want insufficient capacity without a Retry-After", burst, res.Err, res.RetryAfter)
			}
			continue
		}
		if first.RetryAfter != time.Second {
			t.Fatalf("burst %d: %v (%s, retry after %s); want a Retry-After of 1s (the images)", burst, first.Err, first.Dimension, first.RetryAfter)
		}
		c.advance(first.RetryAfter)
		c.must(c.reserve("d", 450))
	}
}
