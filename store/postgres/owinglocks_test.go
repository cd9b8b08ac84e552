package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// freezeSubjects freezes each of keys with two owing accounts, as a
// subject stands after two generation switches: generation 1 (tokens and
// images) owes images, generation 2 (tokens and requests) owes requests
// and is current, and the deciding generation 3 limits tokens only;
// both debts are repaid at a unit an hour. Generation 1 also keeps holds
// of a token each made before the switches, named by hold(k, i) for i <
// holds. It returns the generation-1 account of each key.
func freezeSubjects(t *testing.T, s store.Store, keys []ledger.PolicyKey, holds int, hold func(ledger.PolicyKey, int) string) map[ledger.PolicyKey]ledger.AccountKey {
	t.Helper()
	dim := func(unit string, burst int64) ledger.Dimension {
		return ledger.Dimension{Unit: unit, Burst: ledger.Units(burst), RefillUnits: 1, RefillInterval: time.Hour, MaxOverdraft: 5}
	}
	tokens := ledger.Dimension{Unit: "tokens", Burst: 1_000_000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500}
	each := func(cmd func(k ledger.PolicyKey) []ledger.Command) []ledger.Result {
		var cmds []ledger.Command
		for _, k := range keys {
			cmds = append(cmds, cmd(k)...)
		}
		res := commitCmds(t, s, t0, cmds...)
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("%s %s: %v", cmds[i].Kind, cmds[i].ReservationID, r.Err)
			}
		}
		return res
	}
	publish := func(dims ...ledger.Dimension) []ledger.Result {
		return each(func(k ledger.PolicyKey) []ledger.Command {
			p := ledger.Policy{Key: k, Dimensions: dims, HoldTTL: time.Hour}.WithDefaults()
			return []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}
		})
	}
	use := func(id string, units ledger.Amounts) func(k ledger.PolicyKey) []ledger.Command {
		return func(k ledger.PolicyKey) []ledger.Command {
			return []ledger.Command{
				{Kind: ledger.KindReserve, ReservationID: id + k.Subject, RequestDigest: "sha256:" + id,
					Subject: k.Subject, Route: k.Route, Region: k.Region, Units: units},
				{Kind: ledger.KindStart, ReservationID: id + k.Subject, OperationID: "op"}}
		}
	}
	settle := func(id string, units ledger.Amounts) func(k ledger.PolicyKey) []ledger.Command {
		return func(k ledger.PolicyKey) []ledger.Command {
			return []ledger.Command{{Kind: ledger.KindSettle, ReservationID: id + k.Subject, OperationID: "op", Units: units}}
		}
	}
	first := publish(tokens, dim("images", 2))
	each(use("img-", ledger.Amounts{10, 1}))
	each(func(k ledger.PolicyKey) []ledger.Command {
		var cmds []ledger.Command
		for i := range holds {
			cmds = append(cmds, ledger.Command{Kind: ledger.KindReserve, ReservationID: hold(k, i), RequestDigest: "sha256:hold",
				Subject: k.Subject, Route: k.Route, Region: k.Region, Units: ledger.Amounts{1, 0}})
		}
		return cmds
	})
	publish(tokens, dim("requests", 2))
	each(use("req-", ledger.Amounts{10, 1}))
	publish(tokens)
	each(func(k ledger.PolicyKey) []ledger.Command { return []ledger.Command{reserveOn(k, "tok-"+k.Subject, 10)} })
	each(settle("req-", ledger.Amounts{10, 5}))
	each(settle("img-", ledger.Amounts{10, 6}))
	owing := map[ledger.PolicyKey]ledger.AccountKey{}
	for i, k := range keys {
		owing[k] = ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: first[i].Generation}
		if r := commitCmds(t, s, t0, reserveOn(k, "probe-"+k.Subject, 1)); !r[0].Rejected() {
			t.Fatalf("%s not frozen: %+v", k, r[0])
		}
	}
	return owing
}

// TestFrozenSubjectsLockInOrder: two replicas commit commands over the
// same frozen subjects (two owing accounts each, neither the deciding
// generation's) at the same time: one reserves on every subject in key
// order, the other releases holds on the subjects' older owing account in
// the reverse order, each in one batch, or each command in a transaction
// of its own (no prefetch: the getters read the rows). Each command
// reads its subject's owing set and the accounts the set names. The set's
// rows are locked before the subject's first account (rankOwing), and a
// batch's prefetch locks the accounts they name with its others: no lock
// timeout, no deadlock, no conflict reaches the caller (the core does not
// retry). Read by the ledger after the accounts, the owing rows and
// accounts were out-of-order locks: about one batch in two timed out
// (55P03) and was run again. No Meta row is locked out of order either:
// the left_behind rows a refund's move away from generation 1 reads are
// locked with the owing set (after its rows, before the accounts; locked
// before them, a command that had read its owing rows one by one
// deadlocked with one that had not).
func TestFrozenSubjectsLockInOrder(t *testing.T) {
	for _, single := range []bool{false, true} {
		t.Run(map[bool]string{false: "batches", true: "single commands"}[single], func(t *testing.T) {
			frozenSubjectsLockInOrder(t, single)
		})
	}
}

func frozenSubjectsLockInOrder(t *testing.T, singleCommands bool) {
	const subjects, rounds = 6, 30
	first, second, keys := twoReplicas(t, subjects)
	hold := func(k ledger.PolicyKey, i int) string { return fmt.Sprintf("h%d-%s", i, k.Subject) }
	freezeSubjects(t, first, keys, rounds, hold)
	var wg sync.WaitGroup
	watched := []*txWatch{{Store: first}, {Store: second}}
	for r, core := range []*engine.Core{engine.NewCore(watched[0]), engine.NewCore(watched[1])} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range rounds {
				var cmds []ledger.Command
				for i := range subjects {
					if r == 0 {
						cmds = append(cmds, reserveOn(keys[i], fmt.Sprintf("f%d-%s", round, keys[i].Subject), 1))
					} else {
						cmds = append(cmds, ledger.Command{Kind: ledger.KindRelease, ReservationID: hold(keys[subjects-1-i], round)})
					}
				}
				batches := [][]ledger.Command{cmds}
				if singleCommands {
					batches = nil
					for i := range cmds {
						batches = append(batches, cmds[i:i+1])
					}
				}
				for _, cmds := range batches {
					results, err := core.Commit(context.Background(), cmds, t0.Add(time.Duration(round+1)*time.Second))
					if err != nil {
						t.Errorf("replica %d round %d: %v", r, round, err)
						continue
					}
					for i := range results {
						if err := results[i].Err; err != nil && !(r == 0 && results[i].Rejected()) {
							t.Errorf("replica %d round %d: %s %s: %v", r, round, cmds[i].Kind, cmds[i].ReservationID, err)
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	snap := mustAudit(t, first)
	// Every hold released; the frozen subjects admitted nothing: each
	// still holds the 10 tokens reserved before it froze.
	reserved := map[ledger.PolicyKey]ledger.Units{}
	for _, a := range snap.Accounts {
		reserved[a.Key.SubjectKey()] += a.Balances[0].Reserved
	}
	for _, k := range keys {
		if reserved[k] != 10 {
			t.Errorf("%s: %d tokens reserved, want 10", k, reserved[k])
		}
	}
	// No Meta row was locked out of order (a lock a replica waits for
	// only briefly, after a round trip that lowers its lock_timeout): the
	// owing-set rows, and the left_behind rows that the releases' refunds
	// (moves away from generation 1, whose images no later generation
	// limits) read, are locked with the owing set, before the accounts.
	for r, w := range watched {
		late := map[string]int{}
		for _, tx := range w.txs {
			for _, name := range postgres.MetaLockedOutOfOrder(tx) {
				late[name]++
			}
		}
		if len(late) > 0 {
			t.Errorf("replica %d: Meta rows locked out of order (by how many transactions): %v", r, late)
		}
	}
	stats := [2]postgres.Stats{first.Stats(), second.Stats()}
	if n := stats[0].LockNotAvailable + stats[1].LockNotAvailable + stats[0].Deadlocks + stats[1].Deadlocks; n != 0 {
		t.Errorf("%d lock timeouts and deadlocks: %+v / %+v", n, stats[0], stats[1])
	}
}

// txWatch is a store that keeps the write transactions it began.
type txWatch struct {
	*postgres.Store
	mu  sync.Mutex
	txs []store.Tx
}

func (w *txWatch) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := w.Store.Begin(ctx)
	if err == nil {
		w.mu.Lock()
		w.txs = append(w.txs, tx)
		w.mu.Unlock()
	}
	return tx, err
}
