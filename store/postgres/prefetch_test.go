package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// getterStore is the PostgreSQL store whose transactions offer only
// store.Tx: the engine's core then reads every row with the getters, as it
// did before the store had prefetches.
type getterStore struct{ store.Store }

func (s getterStore) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return struct{ store.Tx }{tx}, nil
}

func subjectKey(i int) ledger.PolicyKey {
	return ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%02d", i), Route: tenant7.Route, Region: tenant7.Region}
}

func publishCmd(k ledger.PolicyKey, burst int64) ledger.Command {
	p := seedPolicy()
	p.Key = k
	p.Dimensions[0].Burst, p.Dimensions[0].MaxReservation = burst, burst
	return ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}
}

func reserveOn(k ledger.PolicyKey, id string, units int64) ledger.Command {
	return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
		Subject: k.Subject, Route: k.Route, Region: k.Region, Units: ledger.Amounts{units}}
}

// TestAccountsPrefetchDecidesAsGetters runs the same batches through the
// engine's core over two fresh schemas, one store prefetching the batches'
// subjects (AccountsPrefetch) and one reading each row with the getters,
// and asks for the same results and the same stored state: subjects whose
// accounts do not exist yet, one without a policy, the same subject twice
// in a batch, and a new generation published between batches (the next
// batch switches the subject over to it).
func TestAccountsPrefetchDecidesAsGetters(t *testing.T) {
	prefetching, _ := openStore(t)
	reading, _ := openStore(t)
	var _ store.AccountsPrefetcher = mustBegin(t, prefetching).(store.AccountsPrefetcher)
	if _, ok := mustBegin(t, getterStore{reading}).(store.AccountsPrefetcher); ok {
		t.Fatal("the getter store's transactions prefetch")
	}
	a, b, c, d := subjectKey(1), subjectKey(2), subjectKey(3), subjectKey(4) // d has no policy
	batches := [][]ledger.Command{
		{publishCmd(a, 1000), publishCmd(b, 1000), publishCmd(c, 500)},
		{reserveOn(c, "r1", 100), reserveOn(a, "r2", 300), reserveOn(d, "r3", 1), reserveOn(a, "r4", 800),
			reserveOn(b, "r5", 200)},
		{reserveOn(b, "r6", 700), reserveOn(a, "r7", 600), reserveOn(c, "r8", 300)},
		{publishCmd(b, 2000)}, // a new generation of b, between batches
		{reserveOn(b, "r9", 1500), reserveOn(a, "r10", 50), reserveOn(d, "r11", 1), reserveOn(c, "r12", 400)},
		{reserveOn(a, "r13", 10), reserveOn(b, "r14", 600), reserveOn(b, "r15", 1)},
	}
	for i, cmds := range batches {
		now := t0.Add(time.Duration(i) * time.Second)
		got := commitCmds(t, prefetching, now, cmds...)
		want := commitCmds(t, getterStore{reading}, now, cmds...)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("batch %d: prefetched results\n%+v\nread one by one\n%+v", i, got, want)
		}
	}
	got, want := mustAudit(t, prefetching), mustAudit(t, reading)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("prefetched batches stored\n%+v\nread one by one\n%+v", got, want)
	}
	// The batches did decide something: b switched to its new generation.
	var generations int
	for _, acc := range got.Accounts {
		if acc.Key.Subject == b.Subject {
			generations++
		}
	}
	if generations != 2 || len(got.Reservations) < 8 {
		t.Errorf("%d accounts of %s, %d reservations: the batches decided too little to compare", generations, b, len(got.Reservations))
	}
}

func mustBegin(t *testing.T, s store.Store) store.Tx {
	t.Helper()
	tx, err := s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// TestAccountsPrefetchOppositeOrders: two replicas (two stores, two pools,
// one schema) commit batches over the same subjects at the same time, one
// naming them in one order, the other in the reverse. The prefetch locks
// the accounts in key order whatever the batch's order, so neither waits
// for the other while holding what the other wants: no deadlock, no lock
// timeout, no conflict reaches the caller (the core does not retry), and
// every unit is accounted for.
func TestAccountsPrefetchOppositeOrders(t *testing.T) {
	const subjects, rounds = 8, 25
	first, second, keys := twoReplicas(t, subjects)
	warmAccounts(t, first, keys)
	concurrentBatches(t, first, second, rounds, func(r, round int) []ledger.Command {
		cmds := make([]ledger.Command, 0, subjects)
		for i := range subjects {
			k := keys[i]
			if r == 1 {
				k = keys[subjects-1-i]
			}
			cmds = append(cmds, reserveOn(k, fmt.Sprintf("o%d-%d-%s", r, round, k.Subject), 1))
		}
		return cmds
	})
	snap := mustAudit(t, first)
	if len(snap.Reservations) != (2*rounds+1)*subjects {
		t.Errorf("%d reservations stored, want %d", len(snap.Reservations), (2*rounds+1)*subjects)
	}
	for _, a := range snap.Accounts {
		if a.Balances[0].Reserved != 2*rounds+1 {
			t.Errorf("%s: %d reserved, want %d", a.Key, a.Balances[0].Reserved, 2*rounds+1)
		}
	}
	t.Logf("stats: %+v / %+v", first.Stats(), second.Stats())
}

// TestAccountsPrefetchLocksReservationAccounts: two replicas commit batches
// that reserve on one half of the subjects and release holds on the other
// half, each replica the halves the other way round, so each batch locks
// some accounts through its reserves' subjects and others through its
// releases' reservations. The prefetch locks both kinds in one statement,
// in key order: no deadlock, no lock timeout, no conflict reaches the
// caller (the core does not retry). Before the reservations' accounts
// were part of it, a release's account was locked by its getter after the
// prefetch had locked the reserves' accounts, out of order for one of the
// two replicas: lock timeouts (55P03) and deadlocks (40P01).
func TestAccountsPrefetchLocksReservationAccounts(t *testing.T) {
	const half, rounds = 4, 30
	first, second, keys := twoReplicas(t, 2*half)
	// sides[r] is what replica r reserves on; it releases holds on the
	// other side, made beforehand (hold ids name replica, round, subject).
	sides := [2][]ledger.PolicyKey{keys[:half], keys[half:]}
	hold := func(r, round int, k ledger.PolicyKey) string { return fmt.Sprintf("h%d-%d-%s", r, round, k.Subject) }
	var holds []ledger.Command
	for r := range 2 {
		for round := range rounds {
			for _, k := range sides[1-r] {
				holds = append(holds, reserveOn(k, hold(r, round, k), 1))
			}
		}
	}
	commitCmds(t, first, t0, holds...)
	concurrentBatches(t, first, second, rounds, func(r, round int) []ledger.Command {
		var cmds []ledger.Command
		for _, k := range sides[r] {
			cmds = append(cmds, reserveOn(k, fmt.Sprintf("n%d-%d-%s", r, round, k.Subject), 1))
		}
		for _, k := range sides[1-r] {
			cmds = append(cmds, ledger.Command{Kind: ledger.KindRelease, ReservationID: hold(r, round, k)})
		}
		return cmds
	})
	snap := mustAudit(t, first)
	for _, a := range snap.Accounts {
		// Every hold made beforehand released; one new hold per round.
		if a.Balances[0].Reserved != rounds {
			t.Errorf("%s: %d reserved, want %d", a.Key, a.Balances[0].Reserved, rounds)
		}
	}
	t.Logf("stats: %+v / %+v", first.Stats(), second.Stats())
}

// TestAccountsPrefetchLocksNamedAccounts: one replica commits batches of
// reserves over some subjects while another commits batches of epoch
// closes (a worker's page) naming the same accounts in the reverse order.
// The closes' accounts are prefetched, locked in key order: no error
// reaches the caller. Read by the getters in the page's order, the second
// and later were out-of-order locks: lock timeouts (55P03).
func TestAccountsPrefetchLocksNamedAccounts(t *testing.T) {
	const subjects, rounds = 8, 30
	first, second, keys := twoReplicas(t, subjects)
	results := warmAccounts(t, first, keys)
	var closes []ledger.Command
	for i := range results {
		k := keys[subjects-1-i]
		closes = append(closes, ledger.Command{Kind: ledger.KindCloseEpoch,
			Account: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: results[subjects-1-i].Generation}})
	}
	concurrentBatches(t, first, second, rounds, func(r, round int) []ledger.Command {
		if r == 1 {
			return closes // the epoch is still open: each reads and locks its account only
		}
		var cmds []ledger.Command
		for _, k := range keys {
			cmds = append(cmds, reserveOn(k, fmt.Sprintf("n%d-%s", round, k.Subject), 1))
		}
		return cmds
	})
}

// twoReplicas opens two stores (two pools, as two replicas have) on one
// new schema, closed when t ends, and publishes a policy for each of
// subjects subjects (subjectKey(0) and on, a burst of 1,000,000), whose
// keys it returns.
func twoReplicas(t *testing.T, subjects int) (first, second *postgres.Store, keys []ledger.PolicyKey) {
	t.Helper()
	first, dsn := openStore(t)
	second, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	var publishes []ledger.Command
	for i := range subjects {
		keys = append(keys, subjectKey(i))
		publishes = append(publishes, publishCmd(keys[i], 1_000_000))
	}
	commitCmds(t, first, t0, publishes...)
	return first, second, keys
}

// warmAccounts creates the account of each of keys (a hold of one unit,
// "warm-" and the subject) and returns the results: two replicas creating
// the same account at once is a unique violation that the engine reruns,
// not what the lock tests are about.
func warmAccounts(t *testing.T, s store.Store, keys []ledger.PolicyKey) []ledger.Result {
	t.Helper()
	var warm []ledger.Command
	for _, k := range keys {
		warm = append(warm, reserveOn(k, "warm-"+k.Subject, 1))
	}
	return commitCmds(t, s, t0, warm...)
}

// concurrentBatches commits rounds batches through the engine's core on
// each of two stores (replicas) at the same time, batch(r, round) on
// replica r, and fails t on every error of a commit or of a command.
func concurrentBatches(t *testing.T, first, second store.Store, rounds int, batch func(r, round int) []ledger.Command) {
	t.Helper()
	var wg sync.WaitGroup
	for r, core := range []*engine.Core{engine.NewCore(first), engine.NewCore(second)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range rounds {
				cmds := batch(r, round)
				results, err := core.Commit(context.Background(), cmds, t0.Add(time.Second))
				if err != nil {
					t.Errorf("replica %d round %d: %v", r, round, err)
					continue
				}
				for i := range results {
					if results[i].Err != nil {
						t.Errorf("replica %d round %d: command %d (%s %s): %v", r, round, i, cmds[i].Kind, cmds[i].ReservationID, results[i].Err)
					}
				}
			}
		}()
	}
	wg.Wait()
}

// TestAccountsPrefetchAnswersWithoutQueries: after AccountsPrefetch the
// getters answer the prefetched subjects, found or absent, without a
// round trip (they are asked with a cancelled context, on which any query
// fails), and what they answer is what the getters read in a transaction
// without the prefetch.
func TestAccountsPrefetchAnswersWithoutQueries(t *testing.T) {
	s, _ := openStore(t)
	a, b, none := subjectKey(1), subjectKey(2), subjectKey(3) // none has no policy
	res := commitCmds(t, s, t0, publishCmd(a, 1000), publishCmd(b, 1000))
	commitCmds(t, s, t0, reserveOn(a, "r1", 10), reserveOn(b, "r2", 20))
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	type answers struct {
		head       *ledger.PolicyHead
		headErr    error
		generation uint64
		genErr     error
		account    *ledger.Account
		accountErr error
	}
	keys := []ledger.PolicyKey{a, b, none}
	accountKey := func(i int) ledger.AccountKey {
		k := keys[i]
		return ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: res[min(i, 1)].Generation}
	}
	ask := func(tx store.Tx, ctx context.Context) []answers {
		var out []answers
		for i, k := range keys {
			var x answers
			x.head, x.headErr = tx.PolicyHeadGet(ctx, k)
			x.generation, x.genErr = tx.AccountCurrentGet(ctx, k)
			if x.genErr == nil {
				x.account, x.accountErr = tx.AccountGet(ctx, accountKey(i))
			}
			out = append(out, x)
		}
		return out
	}
	read := mustBegin(t, s)
	want := ask(read, ctx)
	if err := read.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	prefetched := mustBegin(t, s)
	if err := prefetched.(store.AccountsPrefetcher).AccountsPrefetch(ctx, []ledger.PolicyKey{b, none, a, b}, nil, nil); err != nil {
		t.Fatal(err)
	}
	got := ask(prefetched, cancelled)
	for i, k := range keys {
		w, g := want[i], got[i]
		if !reflect.DeepEqual(g.head, w.head) || !reflect.DeepEqual(g.account, w.account) || g.generation != w.generation ||
			!sameErr(g.headErr, w.headErr) || !sameErr(g.genErr, w.genErr) || !sameErr(g.accountErr, w.accountErr) {
			t.Errorf("%s: prefetched %+v; read %+v", k, g, w)
		}
	}
	if want[0].account == nil || want[1].account == nil || want[0].head == nil || want[2].headErr == nil || want[2].genErr == nil {
		t.Errorf("read %+v: want heads and accounts of %s and %s, neither of %s", want, a, b, none)
	}
	// A subject that was not prefetched is read: the cancelled context fails.
	if _, err := prefetched.AccountCurrentGet(cancelled, subjectKey(4)); err == nil {
		t.Error("a subject that was not prefetched answered without a query")
	}
}

// sameErr: both nil, or both ErrNotFound.
func sameErr(got, want error) bool {
	if want == nil || got == nil {
		return got == want
	}
	return errors.Is(got, store.ErrNotFound) && errors.Is(want, store.ErrNotFound)
}
