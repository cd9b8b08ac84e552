package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// The resolver records its last answer per USAGE_UNKNOWN reservation in
// the store, and a new resolver over the same store (a restart, another
// worker leader) goes on with the stored backoff instead of asking again
// at once; answers of reservations that left USAGE_UNKNOWN are pruned at
// the end of a pass.
func TestResolverRecordsAnswersAndResumesItsBackoff(t *testing.T) {
	clk := newClock()
	src := newScripted()
	st := memstore.New()
	opts := ResolverOptions{Source: src, MinBackoff: 4 * time.Second, MaxBackoff: time.Minute, Seed: 3}
	first := New(st, Options{DisableWorkers: true, Clock: clk.Now, Resolver: &opts})
	ctx := context.Background()
	publish(t, first, 10000, time.Minute, 30*time.Second)
	unknownWork(t, first, clk, "fin", "run", "down", "noendpoint")
	src.set("op-fin", OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 10}}, nil)
	src.set("op-run", OperationStatus{State: OperationRunning}, nil)
	src.set("op-down", OperationStatus{}, errors.New("HTTP 503"))

	first.RunResolver(ctx)
	askedAt := clk.Now()
	got, err := st.ResolverAnswersGet(ctx, []string{"fin", "run", "down", "noendpoint"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("stored answers %+v, want run, down and noendpoint (fin settled)", got)
	}
	want := map[string]string{"run": "running", "down": AnswerError, "noendpoint": AnswerNoEndpoint}
	for _, a := range got {
		if a.Answer != want[a.ReservationID] || !a.AskedAt.Equal(askedAt) || a.Attempts != 1 || !a.NextAt.After(askedAt) {
			t.Errorf("stored answer %+v, want %q asked at %v, 1 attempt, next after it", a, want[a.ReservationID], askedAt)
		}
		if a.ReservationID == "down" && !strings.Contains(a.Detail, "503") {
			t.Errorf("error answer without its error: %+v", a)
		}
	}

	// Two more questions about "down", past each backoff.
	for range 2 {
		before := src.count("op-down")
		for src.count("op-down") == before {
			clk.Advance(time.Second)
			first.RunResolver(ctx)
		}
	}
	down := storedAnswer(t, st, "down")
	if down.Attempts != 3 {
		t.Fatalf("after three questions the stored answer says %d attempts", down.Attempts)
	}
	first.Close()

	// A new resolver over the same store asks nobody before the stored
	// next question is due.
	second := New(st, Options{DisableWorkers: true, Clock: clk.Now, Resolver: &opts})
	defer second.Close()
	asked := src.count("op-down")
	second.RunResolver(ctx)
	if n := src.count("op-down"); n != asked && clk.Now().Before(down.NextAt) {
		t.Fatalf("a restarted resolver asked again before the stored next question (%v)", down.NextAt)
	}
	for src.count("op-down") == asked {
		clk.Advance(time.Second)
		second.RunResolver(ctx)
	}
	if clk.Now().Before(down.NextAt) {
		t.Fatalf("asked at %v, before the stored next question %v", clk.Now(), down.NextAt)
	}
	if a := storedAnswer(t, st, "down"); a.Attempts != 4 {
		t.Fatalf("the restarted resolver counts %d attempts, want 4 (it went on from 3)", a.Attempts)
	}

	// "run" settles through its gateway; the next pass prunes its answer.
	if res, err := second.Do(ctx, ledger.Command{Kind: ledger.KindSettle, ReservationID: "run", OperationID: "op-run", Units: ledger.Amounts{5}}); err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	second.RunResolver(ctx)
	if n, err := st.ResolverAnswersPrune(ctx); err != nil || n != 0 {
		t.Fatalf("after a pass, %d stale answers were left (%v)", n, err)
	}
	auditClean(t, second)
}

func storedAnswer(t *testing.T, st store.ResolverAnswers, id string) store.ResolverAnswer {
	t.Helper()
	got, err := st.ResolverAnswersGet(context.Background(), []string{id})
	if err != nil || len(got) != 1 {
		t.Fatalf("stored answer of %s: %v, %v", id, got, err)
	}
	return got[0]
}
