package client

import (
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"connectrpc.com/connect"
)

// RetryPolicy says how often and how patiently the SDK repeats a call whose
// answer was lost. Every repeat sends the same ids (reservation id, request
// digest, operation id), so a repeat is recognised by the ledger and never
// applied twice.
type RetryPolicy struct {
	// MaxAttempts is the number of calls in total, including the first
	// (default 6; 1 disables retries).
	MaxAttempts int
	// BaseDelay is the backoff cap before the first repeat (default 20ms);
	// it doubles per attempt up to MaxDelay (default 2s).
	BaseDelay time.Duration
	MaxDelay  time.Duration
}

// DefaultRetryPolicy is used when New gets no WithRetryPolicy option.
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 6, BaseDelay: 20 * time.Millisecond, MaxDelay: 2 * time.Second}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultRetryPolicy.MaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = DefaultRetryPolicy.BaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = DefaultRetryPolicy.MaxDelay
	}
	if p.MaxDelay < p.BaseDelay {
		p.MaxDelay = p.BaseDelay
	}
	return p
}

// Backoff returns the wait before repeat number retry (0 for the first
// repeat), exponential backoff with full jitter: a uniformly random
// duration in [0, min(MaxDelay, BaseDelay*2^retry)). Full jitter spreads
// the repeats of many gateways that lost their answers at the same moment,
// so they do not hit the recovering ledger in lockstep. intn(n) must return
// a uniform value in [0, n); nil uses math/rand/v2.
func (p RetryPolicy) Backoff(retry int, intn func(n int64) int64) time.Duration {
	p = p.withDefaults()
	ceiling := p.MaxDelay
	if retry < 62 {
		if d := p.BaseDelay << retry; d > 0 && d < ceiling {
			ceiling = d
		}
	}
	if intn == nil {
		intn = rand.Int64N
	}
	return time.Duration(intn(int64(ceiling)))
}

// halfJitter returns a wait drawn uniformly from [d/2, d): the jitter of
// the breaker's probes (docs/CLIENTS.md, section 4), of the background
// lookups of lost Reserves and of the resends of kept settles. Half the
// wait is kept, so a backoff still backs off; the other half spreads
// clients that started waiting at the same moment. d <= 0 is 0.
func halfJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(rand.Int64N(int64(d-d/2)))
}

// do calls f until it returns an answer (success or an error the ledger
// decided), the caller's ctx ends, or the policy's attempts are used up.
// Each attempt runs under its own timeout derived from ctx. It returns f's
// last result, the number of attempts made, and whether an answer was lost:
// some attempt failed after its request may have reached the ledger, so
// the call may or may not have been applied. Attempts that could not even
// connect (dial errors) lose nothing, nor do attempts the circuit breaker
// refused (it returns its UNAVAILABLE ErrLedgerUnreachable error then),
// nor a call whose ctx had ended before its first attempt (it returns
// ctx.Err() and sends nothing).
func do[T any](ctx context.Context, c *Client, f func(context.Context) (T, error)) (result T, attempts int, lost bool, err error) {
	p := c.retry
	for attempt := 0; ; attempt++ {
		if berr := c.breaker.allow(); berr != nil {
			// The ledger is known unreachable: this attempt is not sent.
			return result, attempts, lost, berr
		}
		if attempt == 0 && ctx.Err() != nil {
			// The caller gave up before anything was sent: nothing can
			// have been applied, so no answer is lost.
			return result, 0, false, ctx.Err()
		}
		actx, cancel := context.WithTimeout(ctx, c.timeout)
		answer := &httpAnswer{}
		actx = context.WithValue(actx, httpAnswerKey{}, answer)
		end := c.breaker.attempt(ctx, c.timeout, cancel)
		result, err = f(actx)
		err = answer.explain(err)
		end(ctx, err)
		cancel()
		attempts = attempt + 1
		if err == nil {
			return result, attempts, false, nil
		}
		if isTransportFault(err) && !isDialError(err) {
			lost = true
		}
		if !retryable(ctx, err) || attempts >= p.MaxAttempts {
			// A decided answer settles the question even after earlier
			// answers were lost; a fault leaves it open, also when the
			// caller's ctx ended mid-call (callers then enter the unknown
			// state rather than assume nothing happened).
			return result, attempts, lost && isTransportFault(err), err
		}
		if c.breaker.allow() != nil {
			continue // opened meanwhile: no point waiting
		}
		wait := p.Backoff(attempt, nil) // full jitter from math/rand
		if hint := serverRetryHint(err); hint > wait {
			wait = min(hint, p.MaxDelay)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return result, attempts, lost && isTransportFault(err), err
		case <-t.C:
		}
	}
}

// isDialError reports whether err happened while connecting, before any
// byte of the request was sent.
func isDialError(err error) bool {
	var op *net.OpError
	var cert *tls.CertificateVerificationError
	return (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &cert)
}

// isTransportFault reports whether err means "no answer was received"
// rather than an answer the ledger decided.
func isTransportFault(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown,
		connect.CodeInternal, connect.CodeAborted, connect.CodeCanceled, connect.CodeDataLoss:
		return true
	}
	return false
}

// serverRetryHint returns the Retry-After of an UNAVAILABLE answer (a
// draining or overloaded server says when to come back), or 0.
func serverRetryHint(err error) time.Duration {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		return 0
	}
	if secs, perr := strconv.ParseInt(ce.Meta().Get("Retry-After"), 10, 64); perr == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	return 0
}
