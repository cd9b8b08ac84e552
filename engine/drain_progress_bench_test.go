package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// countingSQLite is the SQLite store counting the reads a drain poll
// makes (the embedded *sqlite.Store keeps its optional capabilities,
// store.Syncer among them).
type countingSQLite struct {
	*sqlite.Store
	reads, rows atomic.Int64
}

func (s *countingSQLite) AccountGet(ctx context.Context, key ledger.AccountKey) (ledger.Account, error) {
	s.reads.Add(1)
	s.rows.Add(1)
	return s.Store.AccountGet(ctx, key)
}

func (s *countingSQLite) AccountsByEpoch(ctx context.Context, f store.EpochFilter) ([]ledger.Account, store.EpochCursor, error) {
	page, next, err := s.Store.AccountsByEpoch(ctx, f)
	s.reads.Add(1)
	s.rows.Add(int64(len(page)))
	return page, next, err
}

func (s *countingSQLite) AccountsOfSubjects(ctx context.Context, subjects []ledger.PolicyKey) ([]ledger.Account, error) {
	out, err := s.Store.AccountsOfSubjects(ctx, subjects)
	s.reads.Add(1)
	s.rows.Add(int64(len(out)))
	return out, err
}

func (s *countingSQLite) ShardList(ctx context.Context) ([]ledger.Shard, error) {
	out, err := s.Store.ShardList(ctx)
	s.reads.Add(1)
	s.rows.Add(int64(len(out)))
	return out, err
}

func (s *countingSQLite) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) ([]ledger.Shard, error) {
	out, err := s.Store.ShardsUnreconciled(ctx, f)
	s.reads.Add(1)
	s.rows.Add(int64(len(out)))
	return out, err
}

func (s *countingSQLite) Begin(ctx context.Context) (store.Tx, error) {
	s.reads.Add(1) // a transaction: the drain commands' batches
	return s.Store.Begin(ctx)
}

// drainBenchAccounts is how many subjects the drain poll benchmark's
// superseded "*" generation holds accounts of.
const drainBenchAccounts = 100_000

// drainBenchFixture returns an engine over SQLite in dir where
// generation 1, a "*" policy of burst 1000, holds n accounts and
// generation 2, a "*" policy of burst 100, supersedes it, after one drain
// pass: a quarter of the subjects drained whole (50 available), a quarter
// drained of their debt, a quarter blocked by burst (1000 available, 100
// of it moved), a quarter blocked with a hold of 10 on generation 1.
func drainBenchFixture(dir string, n int) (*Engine, *countingSQLite, error) {
	ctx := context.Background()
	sq, err := sqlite.Open(ctx, filepath.Join(dir, "capledger.db"))
	if err != nil {
		return nil, nil, err
	}
	st := &countingSQLite{Store: sq}
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	e := New(st, Options{DisableWorkers: true, Clock: func() time.Time { return now }})
	publish := func(burst int64) error {
		p := ledger.Policy{
			Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst, RefillUnits: 1, RefillInterval: time.Hour, MaxOverdraft: 100}},
		}.WithDefaults()
		res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
		if err == nil {
			err = res.Err
		}
		return err
	}
	if err := publish(1000); err != nil {
		return nil, nil, err
	}
	id := func(i int) string { return fmt.Sprintf("rl-%07d", i) }
	units := []int64{10, 950, 10, 1000}
	steps := []func(i int) (ledger.Command, bool){
		func(i int) (ledger.Command, bool) {
			return ledger.Command{Kind: ledger.KindReserve, ReservationID: id(i), RequestDigest: "sha256:" + id(i),
				Subject: fmt.Sprintf("tenant-%07d", i), Route: "chat.generate", Region: "eu", Units: ledger.Amounts{units[i%4]}}, true
		},
		func(i int) (ledger.Command, bool) {
			switch i % 4 {
			case 0:
				return ledger.Command{Kind: ledger.KindRelease, ReservationID: id(i)}, true
			case 1, 3:
				return ledger.Command{Kind: ledger.KindStart, ReservationID: id(i), OperationID: "op-" + id(i)}, true
			}
			return ledger.Command{}, false
		},
		func(i int) (ledger.Command, bool) {
			if i%2 == 1 {
				return ledger.Command{Kind: ledger.KindSettle, ReservationID: id(i), OperationID: "op-" + id(i),
					Units: ledger.Amounts{units[i%4] + int64(i%4/3)*10}}, true
			}
			return ledger.Command{}, false
		},
	}
	for _, step := range steps {
		cmds := make([]ledger.Command, 0, 500)
		for i := 0; i < n; i++ {
			if cmd, ok := step(i); ok {
				cmds = append(cmds, cmd)
			}
			if len(cmds) == cap(cmds) || i == n-1 {
				results, err := e.DoBatch(ctx, cmds)
				if err != nil {
					return nil, nil, err
				}
				for _, r := range results {
					if r.Err != nil {
						return nil, nil, r.Err
					}
				}
				cmds = cmds[:0]
			}
		}
	}
	if err := publish(100); err != nil {
		return nil, nil, err
	}
	if _, err := e.RunDrains(ctx); err != nil {
		return nil, nil, err
	}
	return e, st, nil
}

// BenchmarkDrainPoll measures one poll of `capledger rollback --wait`
// (DrainProgress with runDrains: the drain pass, then the progress of
// generation 1) over SQLite, drainBenchAccounts accounts on the
// superseded generation, half of them blocked by burst (drainBenchFixture,
// built once, before the timer). poll=before is the computation before
// the deciding accounts were read a page at a time
// (drainProgressOneByOne), poll=after today's; the two alternate, three
// rounds each. reads/poll counts the store's reads (the drain commands'
// transactions included), rows/poll the accounts and shards they
// returned, cpu-ms/poll the process's CPU time (user and system).
//
//	go test -run '^$' -bench DrainPoll -benchtime 3x ./engine
func BenchmarkDrainPoll(b *testing.B) {
	e, st, err := drainBenchFixture(b.TempDir(), drainBenchAccounts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close(); st.Close() })
	polls := map[string]func(ctx context.Context) ([]GenerationDrain, error){
		"before": func(ctx context.Context) ([]GenerationDrain, error) {
			if _, err := e.RunDrains(ctx); err != nil {
				return nil, err
			}
			return drainProgressOneByOne(ctx, e, []uint64{1})
		},
		"after": func(ctx context.Context) ([]GenerationDrain, error) {
			if _, err := e.RunDrains(ctx); err != nil {
				return nil, err
			}
			return e.DrainProgress(ctx, []uint64{1})
		},
	}
	for range 3 {
		for _, name := range []string{"before", "after"} {
			b.Run("poll="+name, func(b *testing.B) {
				ctx := context.Background()
				reads, rows, cpu := st.reads.Load(), st.rows.Load(), processCPU(b)
				b.ResetTimer()
				for range b.N {
					d, err := polls[name](ctx)
					if err != nil {
						b.Fatal(err)
					}
					if d[0].Accounts != drainBenchAccounts || d[0].BlockedByBurst != drainBenchAccounts/2 {
						b.Fatalf("generation 1: %+v, want %d accounts, half blocked by burst", d[0], drainBenchAccounts)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64((processCPU(b)-cpu).Milliseconds())/float64(b.N), "cpu-ms/poll")
				b.ReportMetric(float64(st.reads.Load()-reads)/float64(b.N), "reads/poll")
				b.ReportMetric(float64(st.rows.Load()-rows)/float64(b.N), "rows/poll")
			})
		}
	}
}

// processCPU returns the CPU time (user and system) this process used so
// far.
func processCPU(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// drainProgressOneByOne is DrainProgress as it was before the deciding
// accounts were read a page at a time: one AccountGet per account that
// holds capacity, and, where the deciding account's refill due decides
// whether it counts blocked, one read of the subject's current pointer
// (which tells whether the deciding account refills in a drain, where
// DrainProgress infers it from the subject's accounts). The tests compare DrainProgress's answers with it.
func drainProgressOneByOne(ctx context.Context, e *Engine, generations []uint64) ([]GenerationDrain, error) {
	now := e.opts.Clock()
	policies, err := e.core.store.PolicyList(ctx)
	if err != nil {
		return nil, fmt.Errorf("policies: %w", err)
	}
	active := ledger.NewActiveGenerations(policies)
	byGeneration := make(map[uint64]*ledger.Policy, len(policies))
	for i := range policies {
		byGeneration[policies[i].Generation] = &policies[i]
	}
	shards, err := e.core.store.ShardList(ctx)
	if err != nil {
		return nil, fmt.Errorf("shards: %w", err)
	}
	out := make([]GenerationDrain, 0, len(generations))
	for _, g := range generations {
		p, ok := byGeneration[g]
		if !ok {
			return nil, fmt.Errorf("policy generation %d: %w", g, store.ErrNotFound)
		}
		d := GenerationDrain{Policy: *p}
		if a, ok := active.Active(p.Key); ok && a == g {
			d.Active = true
		}
		f := store.EpochFilter{Generation: g, Limit: e.opts.PageSize}
		for {
			page, next, err := e.core.store.AccountsByEpoch(ctx, f)
			if err != nil {
				return nil, fmt.Errorf("accounts of generation %d: %w", g, err)
			}
			for i := range page {
				if err := addDrainOneByOne(ctx, e, &d, &page[i], active, byGeneration, now); err != nil {
					return nil, err
				}
			}
			if len(page) < f.Limit {
				break
			}
			f.After = next
		}
		for i := range shards {
			if s := &shards[i]; s.Account.Generation == g && !s.Reconciled {
				d.UnreconciledShards++
				for j := range s.Allocated {
					d.ShardUnits[j] += s.Allocated[j]
				}
				if s.IsLegacyBudget() {
					d.LegacyBudgets++
					for j := range s.Allocated {
						d.LegacyUnits[j] += s.Allocated[j]
					}
				}
			}
		}
		out = append(out, d)
	}
	return out, nil
}

func addDrainOneByOne(ctx context.Context, e *Engine, d *GenerationDrain, a *ledger.Account, active ledger.ActiveGenerations, byGeneration map[uint64]*ledger.Policy, now time.Time) error {
	d.Accounts++
	for i := 0; i < a.Dims; i++ {
		b := &a.Balances[i]
		d.Reserved[i] += b.Reserved
		d.Debt[i] += b.Debt()
		d.Available[i] += b.Available
	}
	if !holds(a) || d.Active {
		return nil
	}
	deciding, ok := active.Deciding(a.Key.SubjectKey())
	if !ok {
		d.BlockedNoPolicy++
		return nil
	}
	if deciding == a.Key.Generation {
		return nil
	}
	target, err := e.core.store.AccountGet(ctx, ledger.AccountKey{Subject: a.Key.Subject, Route: a.Key.Route, Region: a.Key.Region, Generation: deciding})
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("account %s: %w", a.Key, err)
	}
	p := byGeneration[deciding]
	if p == nil {
		return nil
	}
	// The deciding account refills in a drain when it is the subject's
	// current account: read here from the current pointer itself, when
	// the answer matters (a refill is due).
	refills := false
	if blockedByBurst(a, &d.Policy, &target, p, false, now) != blockedByBurst(a, &d.Policy, &target, p, true, now) {
		if refills, err = isCurrent(ctx, e, a.Key.SubjectKey(), deciding); err != nil {
			return err
		}
	}
	if blockedByBurst(a, &d.Policy, &target, p, refills && !p.RolledBack, now) {
		d.BlockedByBurst++
	}
	return nil
}

// isCurrent reports whether generation holds subject's capacity (the
// subject's current pointer), read in a transaction rolled back.
func isCurrent(ctx context.Context, e *Engine, subject ledger.PolicyKey, generation uint64) (bool, error) {
	tx, err := e.core.store.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	current, err := tx.AccountCurrentGet(ctx, subject)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("current of %s: %w", subject, err)
	}
	return current == generation, nil
}
