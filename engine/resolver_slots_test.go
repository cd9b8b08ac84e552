package engine

import (
	"context"
	"testing"
	"time"
)

// waitForWaiters waits until n lanes wait for a slot of s.
func waitForWaiters(t *testing.T, s *callSlots, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		got := len(s.waiting)
		s.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes wait for a slot, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCallSlotsGoToTheOldestWaiterAmongEquals: routes with as many calls
// out wait for a freed slot in turn, oldest first, so none is passed
// over again and again by routes that queued after it.
func TestCallSlotsGoToTheOldestWaiterAmongEquals(t *testing.T) {
	s := newCallSlots(1)
	if !s.acquire(context.Background(), "held") {
		t.Fatal("no free slot")
	}
	got := make(chan string, 3)
	for i, route := range []string{"first", "second", "third"} {
		go func() {
			if s.acquire(context.Background(), route) {
				got <- route
			}
		}()
		waitForWaiters(t, s, i+1)
	}
	release := "held"
	for _, want := range []string{"first", "second", "third"} {
		s.release(release)
		select {
		case route := <-got:
			if route != want {
				t.Fatalf("the freed slot went to %q, want the oldest waiter %q", route, want)
			}
			release = route
		case <-time.After(5 * time.Second):
			t.Fatalf("the freed slot went to nobody, want %q", want)
		}
	}
}

// TestCallSlotsNotLostWhenAWaiterGivesUp: a lane whose context ends
// just as a slot is handed to it hands the slot on, so MaxInFlight slots
// stay in use however many lanes give up (a lost slot would be gone for
// good, until the resolver asked nothing). Repeated, because which of the
// two the waiter sees first is up to the scheduler.
func TestCallSlotsNotLostWhenAWaiterGivesUp(t *testing.T) {
	for range 300 {
		s := newCallSlots(1)
		if !s.acquire(context.Background(), "held") {
			t.Fatal("no free slot")
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan bool)
		go func() { done <- s.acquire(ctx, "giving-up") }()
		waitForWaiters(t, s, 1)
		cancel()
		s.release("held")
		if <-done {
			s.release("giving-up") // it was handed the slot before it gave up
		}
		s.mu.Lock()
		free, out, waiting := s.free, len(s.out), len(s.waiting)
		s.mu.Unlock()
		if free != 1 || out != 0 || waiting != 0 {
			t.Fatalf("after every slot was given back: %d free (want 1), %d routes with calls out, %d waiting", free, out, waiting)
		}
	}
}
