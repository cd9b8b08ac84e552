package engine

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// syncGatedStore is a pipelined memstore whose Sync waits for a release
// and tells when it was entered, so a test can hold an fsync in flight.
type syncGatedStore struct {
	*memstore.Store
	entered chan struct{}
	release chan struct{}
}

func (s *syncGatedStore) Sync(ctx context.Context) error {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Sync(ctx)
}

// fsyncBegins waits for the next fsync to begin, failing the test when
// none does: a pipelined batch must be synced before it is answered.
func (s *syncGatedStore) fsyncBegins(t *testing.T, what string) {
	t.Helper()
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("no fsync began %s", what)
	}
}

func pipelinedMem() *memstore.Store {
	m := memstore.New()
	m.SetPipelined(true)
	return m
}

// A pipelined engine answers a batch only after its fsync, and commits the
// next batch while that fsync is in flight.
func TestPipelinedBatchAnsweredAfterItsSyncWhileTheNextCommits(t *testing.T) {
	mem := pipelinedMem()
	st := &syncGatedStore{Store: mem, entered: make(chan struct{}, 16), release: make(chan struct{})}
	e := New(st, Options{DisableWorkers: true})
	defer e.Close()
	if !e.Pipelined() {
		t.Fatal("engine over a pipelined store is not pipelined")
	}
	go func() {
		for range st.entered { // let the publish's fsync through
			st.release <- struct{}{}
			return
		}
	}()
	publish(t, e, 100000, time.Minute, 0)

	ctx := context.Background()
	answered := make(chan string, 2)
	do := func(id string) {
		res, err := e.Do(ctx, reserveCmd(id, 10))
		if err != nil || res.Err != nil {
			t.Errorf("%s: %v %v", id, err, res.Err)
		}
		answered <- id
	}
	go do("first")
	st.fsyncBegins(t, "for first's batch") // first is committed, its fsync in flight
	if !mem.Unsynced() {
		t.Fatal("first's batch is not waiting for its fsync")
	}
	go do("second")
	// second commits while first's fsync is held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := mem.ReservationGet(ctx, "second"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the next batch did not commit while the previous one's fsync was in flight")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case id := <-answered:
		t.Fatalf("%s answered before any fsync returned", id)
	case <-time.After(50 * time.Millisecond):
	}
	st.release <- struct{}{} // first's fsync returns
	if id := <-answered; id != "first" {
		t.Fatalf("%s answered first", id)
	}
	// second's commit came after first's fsync began: it needs its own.
	select {
	case <-st.entered:
	case id := <-answered:
		t.Fatalf("%s answered without an fsync after its commit", id)
	}
	st.release <- struct{}{}
	if id := <-answered; id != "second" {
		t.Fatalf("answered %s", id)
	}
	close(st.entered)
	auditClean(t, e)
}

// fsyncgate: after a failed fsync the engine refuses every command and
// read, and Ready reports it, until a new engine opens the store.
func TestFailedFsyncRefusesEverythingUntilRestart(t *testing.T) {
	mem := pipelinedMem()
	e := New(mem, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 100000, time.Minute, 0)
	ctx := context.Background()
	if _, err := e.Do(ctx, reserveCmd("before", 10)); err != nil {
		t.Fatal(err)
	}

	mem.FailNextSync(syscall.EIO)
	_, err := e.Do(ctx, reserveCmd("lost", 10))
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("reserve whose fsync failed: %v, want ErrUnavailable", err)
	}
	for i := range 3 {
		if _, err := e.Do(ctx, reserveCmd("after", 10)); err == nil || !strings.Contains(err.Error(), "fsync") {
			t.Fatalf("command %d after the failed fsync: %v, want the fsync failure", i, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.Ready(); err == nil || !strings.Contains(err.Error(), "fsync") {
		t.Fatalf("Ready after a failed fsync: %v", err)
	}
	if _, err := e.Accounts(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}); err == nil {
		t.Fatal("a read answered after the failed fsync")
	}
	if _, err := e.Reservation(ctx, "before"); err == nil {
		t.Fatal("a lookup answered after the failed fsync")
	}
}

// A batch that wrote nothing (a replay) read what the batches before it
// wrote, so it is answered only once they are durable too.
func TestPipelinedReplayWaitsForTheFsyncOfWhatItRead(t *testing.T) {
	mem := pipelinedMem()
	st := &syncGatedStore{Store: mem, entered: make(chan struct{}, 16), release: make(chan struct{})}
	e := New(st, Options{DisableWorkers: true})
	defer e.Close()
	go func() { <-st.entered; st.release <- struct{}{} }()
	publish(t, e, 100000, time.Minute, 0)
	ctx := context.Background()
	done := make(chan struct{}, 2)
	go func() { e.Do(ctx, reserveCmd("r", 10)); done <- struct{}{} }()
	st.fsyncBegins(t, "for the reserve") // r committed, fsync held
	go func() {
		res, err := e.Do(ctx, reserveCmd("r", 10))
		if err != nil || res.Err != nil || !res.Replayed {
			t.Errorf("replay: %+v %v", res, err)
		}
		done <- struct{}{}
	}()
	select {
	case <-done:
		t.Fatal("answered before the fsync of the reserve it replays")
	case <-time.After(100 * time.Millisecond):
	}
	st.release <- struct{}{}
	go func() { // later fsyncs (the replay's own) pass
		for range st.entered {
			st.release <- struct{}{}
		}
	}()
	<-done
	<-done
	close(st.entered)
}
