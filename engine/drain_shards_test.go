package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// shardReads counts the shards DrainProgress reads: every shard
// (ShardList: lists, listed) or a generation's unreconciled ones
// (ShardsUnreconciled).
type shardReads struct {
	store.Store
	lists, listed, unreconciled atomic.Int64
}

func (s *shardReads) ShardList(ctx context.Context) ([]ledger.Shard, error) {
	out, err := s.Store.ShardList(ctx)
	s.lists.Add(1)
	s.listed.Add(int64(len(out)))
	return out, err
}

func (s *shardReads) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) ([]ledger.Shard, error) {
	out, err := s.Store.ShardsUnreconciled(ctx, f)
	s.unreconciled.Add(int64(len(out)))
	return out, err
}

// DrainProgress reads the open shards of the generations it is asked
// about, page by page, not every shard: with 12 shards issued under
// generation 1 (9 of them reconciled) and 5 under generation 2, the
// progress of generation 1 reads its 3 open shards (pages of 2) and
// never the list of every shard, and answers as a pass over every shard
// (drainProgressOneByOne) does; on the in-memory store and SQLite.
func TestDrainProgressReadsOnlyItsOpenShards(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := &shardReads{Store: open(t)}
			e := New(st, Options{DisableWorkers: true, PageSize: 2, Clock: func() time.Time { return t0 }})
			t.Cleanup(func() { e.Close() })
			do := func(cmd ledger.Command) {
				t.Helper()
				if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
					t.Fatalf("%s %s: %+v, %v", cmd.Kind, cmd.Subject, res, err)
				}
			}
			publish := func(burst int64) {
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
					Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}, EmergencyMode: true}.WithDefaults()
				do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
			issue := func(id string, units int64, legacy bool) {
				gateway := "gw-" + id
				if legacy {
					gateway = ledger.LegacyGateway("limiter-" + id)
				}
				do(ledger.Command{Kind: ledger.KindShardIssue, Subject: "t-" + id, Route: "chat.generate", Region: "eu",
					Units: ledger.Amounts{units}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway, BootEpoch: 1,
						TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key), Legacy: legacy}})
			}
			publish(1000) // generation 1
			for i := range 12 {
				id := fmt.Sprintf("a-%02d", i)
				issue(id, int64(10+i), i == 4)
				if i%4 != 0 {
					do(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw-" + id}})
				}
			}
			publish(2000) // generation 2
			for i := range 5 {
				issue(fmt.Sprintf("b-%02d", i), 7, false)
			}

			st.lists.Store(0)
			st.unreconciled.Store(0)
			got, err := e.DrainProgress(ctx, []uint64{1})
			if err != nil {
				t.Fatal(err)
			}
			if d := got[0]; d.UnreconciledShards != 3 || d.ShardUnits[0] != 10+14+18 || d.LegacyBudgets != 1 || d.LegacyUnits[0] != 14 {
				t.Errorf("generation 1: %d shards of %v, legacy %d of %v; want 3 of 42, legacy 1 of 14",
					d.UnreconciledShards, d.ShardUnits, d.LegacyBudgets, d.LegacyUnits)
			}
			if lists, rows := st.lists.Load(), st.unreconciled.Load(); lists != 0 || rows != 3 {
				t.Errorf("generation 1: %d reads of every shard, %d unreconciled shards read; want none and 3", lists, rows)
			}
			for _, gens := range [][]uint64{{1}, {2}, {1, 2}} {
				got, err := e.DrainProgress(ctx, gens)
				if err != nil {
					t.Fatal(err)
				}
				want, err := drainProgressOneByOne(ctx, e, gens)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("generations %v:\n got %+v\nwant %+v", gens, got, want)
				}
			}
		})
	}
}

// BenchmarkDrainProgressShards times DrainProgress of a generation on
// SQLite holding 100,000 shards, 100 of them unreconciled (the rest
// reconciled, kept until retention removes them), and one account. It
// reports the shards read per call (shards/op).
func BenchmarkDrainProgressShards(b *testing.B) {
	const shards, open = 100_000, 100
	ctx := context.Background()
	sq, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "capledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	st := &shardReads{Store: sq}
	b.Cleanup(func() { st.Close() })
	e := New(st, Options{DisableWorkers: true, Clock: func() time.Time { return t0 }})
	b.Cleanup(func() { e.Close() })
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}, EmergencyMode: true}.WithDefaults()
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		b.Fatal(res, err)
	}
	for from := 0; from < shards; from += 5000 {
		var page []ledger.Shard
		for i := from; i < from+5000; i++ {
			sh := ledger.Shard{ID: fmt.Sprintf("sh-%06d", i), Account: ledger.AccountKey{Subject: fmt.Sprintf("t-%d", i%1000),
				Route: "chat.generate", Region: "eu", Generation: 1}, GatewayID: fmt.Sprintf("gw-%d", i), BootEpoch: 1, Fence: 1,
				Allocated: ledger.Amounts{10}, IssuedAt: t0, ExpiresAt: t0.Add(time.Minute), KeyID: "k1", Signature: make([]byte, 64)}
			if i%(shards/open) != 0 {
				sh.Reconciled, sh.Reminted = true, sh.Allocated
			}
			page = append(page, sh)
		}
		tx, err := st.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.Write(ctx, &store.Changes{Shards: page}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	st.listed.Store(0)
	st.unreconciled.Store(0)
	b.ResetTimer()
	for range b.N {
		got, err := e.DrainProgress(ctx, []uint64{1})
		if err != nil || got[0].UnreconciledShards != open {
			b.Fatalf("%+v, %v", got, err)
		}
	}
	b.ReportMetric(float64(st.listed.Load()+st.unreconciled.Load())/float64(b.N), "shards/op")
}
