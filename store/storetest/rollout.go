package storetest

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

var rolloutCases = []struct {
	name string
	f    func(t *testing.T, s store.Store)
}{
	{"RolloutRoundTrip", testRolloutRoundTrip},
	{"RolloutVersions", testRolloutVersions},
	{"RolloutConcurrentSteps", testRolloutConcurrentSteps},
}

func rollouts(t *testing.T, s store.Store) store.Rollouts {
	t.Helper()
	r, ok := s.(store.Rollouts)
	if !ok {
		t.Fatalf("%T does not keep rollouts (store.Rollouts)", s)
	}
	return r
}

func sampleRollout(t *testing.T, name string) ledger.Rollout {
	t.Helper()
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	r, err := ledger.NewRollout(name, ledger.RolloutBySubject,
		[]ledger.RouteKey{{Route: "chat.generate"}, {Route: "embed.create", Region: "eu"}}, nil, "ops", at)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A rollout reads back exactly as written, its whole history included,
// and the list is ordered by name.
func testRolloutRoundTrip(t *testing.T, s store.Store) {
	ctx := context.Background()
	rs := rollouts(t, s)
	if list, err := rs.RolloutList(ctx); err != nil || len(list) != 0 {
		t.Fatalf("empty store lists %v, %v", list, err)
	}
	if _, err := rs.RolloutGet(ctx, "none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get of a missing rollout: %v", err)
	}
	b := sampleRollout(t, "b-chat")
	a := sampleRollout(t, "a-embed")
	for _, r := range []*ledger.Rollout{&b, &a} {
		if err := rs.RolloutPut(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	at := b.Steps[0].At
	if _, err := b.SetShare(100, "ops", at.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SetShare(2500, "alice", at.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Undo("bob", at.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if !b.End("carol", at.Add(4*time.Minute)) {
		t.Fatal("end: not recorded")
	}
	b.Version = 2 // stored at 1: one write for the four steps
	if err := rs.RolloutPut(ctx, &b); err != nil {
		t.Fatal(err)
	}
	got, err := rs.RolloutGet(ctx, "b-chat")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, b) || !got.Ended() {
		t.Errorf("read back (ended %v)\n%+v\nwrote\n%+v", got.Ended(), got, b)
	}
	list, err := rs.RolloutList(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "a-embed" || list[1].Name != "b-chat" {
		t.Fatalf("list %v, %v", list, err)
	}
}

// A write replaces exactly the version it names the successor of: a
// second create is ErrDuplicate, a stale or skipping write ErrConflict,
// and neither changes what is stored.
func testRolloutVersions(t *testing.T, s store.Store) {
	ctx := context.Background()
	rs := rollouts(t, s)
	r := sampleRollout(t, "chat")
	if err := rs.RolloutPut(ctx, &r); err != nil {
		t.Fatal(err)
	}
	if err := rs.RolloutPut(ctx, &r); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("second create: %v", err)
	}
	missing := sampleRollout(t, "missing")
	missing.Version = 2
	if err := rs.RolloutPut(ctx, &missing); !errors.Is(err, store.ErrConflict) {
		t.Errorf("update of a missing rollout: %v", err)
	}
	step := r
	step.Steps = append([]ledger.RolloutStep(nil), r.Steps...)
	if _, err := step.SetShare(500, "ops", r.Steps[0].At); err != nil {
		t.Fatal(err)
	}
	skip := step
	skip.Version = 3
	if err := rs.RolloutPut(ctx, &skip); !errors.Is(err, store.ErrConflict) {
		t.Errorf("write skipping a version: %v", err)
	}
	if err := rs.RolloutPut(ctx, &step); err != nil {
		t.Fatal(err)
	}
	if err := rs.RolloutPut(ctx, &step); !errors.Is(err, store.ErrConflict) {
		t.Errorf("stale write of the same version: %v", err)
	}
	got, err := rs.RolloutGet(ctx, "chat")
	if err != nil || got.Version != 2 || got.Share != 500 || len(got.Steps) != 2 {
		t.Fatalf("stored %+v, %v", got, err)
	}
	if _, err := rs.RolloutGet(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused write stored something: %v", err)
	}
}

// Two writers stepping the same version at once: exactly one wins.
func testRolloutConcurrentSteps(t *testing.T, s store.Store) {
	ctx := context.Background()
	rs := rollouts(t, s)
	r := sampleRollout(t, "chat")
	if err := rs.RolloutPut(ctx, &r); err != nil {
		t.Fatal(err)
	}
	const writers = 4
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := r
			mine.Steps = append([]ledger.RolloutStep(nil), r.Steps...)
			mine.SetShare(ledger.BasisPoints(100*(i+1)), "ops", r.Steps[0].At)
			errs[i] = rs.RolloutPut(ctx, &mine)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrConflict):
			t.Errorf("losing writer: %v, want ErrConflict", err)
		}
	}
	if won != 1 {
		t.Errorf("%d writers won, want 1", won)
	}
}
