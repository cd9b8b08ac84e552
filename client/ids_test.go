package client

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

func TestReservationIDsAreUniqueAndSortedUnderConcurrency(t *testing.T) {
	const goroutines, each = 8, 2000
	var mu sync.Mutex
	seen := make(map[string]bool, goroutines*each)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]string, each)
			for i := range local {
				local[i] = NewReservationID()
			}
			// Ids minted one after the other by one goroutine sort in that
			// order, whatever the other goroutines mint in between.
			for i := 1; i < len(local); i++ {
				if local[i] <= local[i-1] {
					t.Errorf("id %s minted after %s sorts before it", local[i], local[i-1])
					return
				}
			}
			mu.Lock()
			for _, id := range local {
				if seen[id] {
					t.Errorf("duplicate id %s", id)
				}
				seen[id] = true
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(seen) != goroutines*each {
		t.Fatalf("got %d distinct ids, want %d", len(seen), goroutines*each)
	}
}

func TestIDFormat(t *testing.T) {
	id := NewReservationID()
	if !strings.HasPrefix(id, "rl-") || len(id) != 3+26 {
		t.Fatalf("reservation id %q: want rl- and 26 characters", id)
	}
	u, err := ulid.ParseStrict(id[3:])
	if err != nil {
		t.Fatalf("reservation id %q is not a ULID: %v", id, err)
	}
	if d := time.Since(u.Timestamp()); d < -time.Minute || d > time.Minute {
		t.Fatalf("ULID time %s is not now", u.Timestamp())
	}
	op := NewOperationID()
	if !strings.HasPrefix(op, "op-") || len(op) != 3+26 {
		t.Fatalf("operation id %q", op)
	}
}

func TestIDsStayOrderedWhenTheClockStepsBack(t *testing.T) {
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	g := newIDGenerator(func() time.Time { return now })
	a := g.next()
	now = now.Add(-time.Hour) // NTP steps the clock back
	b := g.next()
	now = now.Add(2 * time.Hour)
	c := g.next()
	if !(a.Compare(b) < 0 && b.Compare(c) < 0) {
		t.Fatalf("ids not increasing across a clock step: %s %s %s", a, b, c)
	}
	if b.Time() != a.Time() {
		t.Fatalf("after a backwards step the id keeps the last time: %d vs %d", b.Time(), a.Time())
	}
}
