package client

import (
	"testing"
	"time"
)

func TestBackoffIsFullJitterUnderAnExponentialCeiling(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 10, BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}
	wantCeilings := []time.Duration{10, 20, 40, 80, 100, 100, 100}
	for retry, ceiling := range wantCeilings {
		ceiling *= time.Millisecond
		var gotN int64
		top := p.Backoff(retry, func(n int64) int64 { gotN = n; return n - 1 })
		if time.Duration(gotN) != ceiling {
			t.Errorf("retry %d: jitter drawn from [0, %s), want [0, %s)", retry, time.Duration(gotN), ceiling)
		}
		if top >= ceiling {
			t.Errorf("retry %d: wait %s reaches the ceiling %s", retry, top, ceiling)
		}
		if bottom := p.Backoff(retry, func(int64) int64 { return 0 }); bottom != 0 {
			t.Errorf("retry %d: full jitter can wait 0, got %s", retry, bottom)
		}
	}
	// A huge retry number neither overflows nor exceeds the cap.
	if d := p.Backoff(200, nil); d < 0 || d >= p.MaxDelay {
		t.Errorf("retry 200: wait %s outside [0, %s)", d, p.MaxDelay)
	}
}

func TestBackoffDefaults(t *testing.T) {
	var p RetryPolicy
	var gotN int64
	p.Backoff(0, func(n int64) int64 { gotN = n; return 0 })
	if time.Duration(gotN) != DefaultRetryPolicy.BaseDelay {
		t.Fatalf("zero policy's first ceiling %s, want the default %s", time.Duration(gotN), DefaultRetryPolicy.BaseDelay)
	}
}

// The breaker's probe waits (and the other backoffs halfJitter spreads)
// are drawn from [d/2, d), as docs/CLIENTS.md section 4 says: never d.
func TestHalfJitterDrawsFromHalfToBelowTheWait(t *testing.T) {
	for _, d := range []time.Duration{1, 2, 3, 4, 7, 200 * time.Millisecond} {
		for range 2000 {
			if got := halfJitter(d); got < d/2 || got >= d {
				t.Fatalf("halfJitter(%d) = %d, want it in [%d, %d)", d, got, d/2, d)
			}
		}
	}
}

// A cap below the base is raised to the base (withDefaults): the first
// repeat's ceiling is BaseDelay, never the smaller MaxDelay.
func TestBackoffCapBelowBaseIsTheBase(t *testing.T) {
	p := RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: 10 * time.Millisecond}
	for retry := range 3 {
		var gotN int64
		p.Backoff(retry, func(n int64) int64 { gotN = n; return 0 })
		if time.Duration(gotN) != p.BaseDelay {
			t.Errorf("retry %d: ceiling %s, want the base %s", retry, time.Duration(gotN), p.BaseDelay)
		}
	}
}
