package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// warmingStore records what the engine hands its warmer.
type warmingStore struct {
	store.Store
	mu     sync.Mutex
	warmed []ledger.PolicyKey
}

func (w *warmingStore) WarmAccounts(subjects []ledger.PolicyKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warmed = append(w.warmed, subjects...)
}

func (w *warmingStore) taken() []ledger.PolicyKey {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.warmed)
}

// TestQueuedReservesWarmTheirAccounts: a batch that has to wait for the
// committer hands the subjects its reserves read to the store's warmer
// (store.AccountsWarmer) before it queues, each subject once; a batch an
// idle engine runs on the caller's goroutine reads them itself.
func TestQueuedReservesWarmTheirAccounts(t *testing.T) {
	st := &warmingStore{Store: memstore.New()}
	e := New(st, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 100000, time.Minute, 0)
	subject := func(i int) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat.generate", Region: "eu"}
	}
	reserve := func(id string, i int) ledger.Command {
		c := reserveCmd(id, 1)
		c.Subject = subject(i).Subject
		return c
	}
	if _, err := e.Do(context.Background(), reserve("rl-idle", 9)); err != nil {
		t.Fatal(err)
	}
	if got := st.taken(); len(got) != 0 {
		t.Fatalf("an idle engine's batch warmed %v", got)
	}

	e.running.Lock() // the committer is busy
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, cmds := range [][]ledger.Command{
		{reserve("rl-1", 1)},
		{reserve("rl-2", 2), reserve("rl-3", 3), reserve("rl-4", 2)},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results, err := e.DoBatch(context.Background(), cmds)
			for _, r := range results {
				if err == nil {
					err = r.Err
				}
			}
			errs <- err
		}()
	}
	for len(e.queue) < 2 {
		time.Sleep(time.Millisecond)
	}
	got := st.taken()
	e.running.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.SortFunc(got, ledger.PolicyKey.Compare)
	if want := []ledger.PolicyKey{subject(1), subject(2), subject(3)}; !slices.Equal(got, want) {
		t.Fatalf("warmed %v; want %v", got, want)
	}
}
