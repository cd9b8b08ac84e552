package postgres_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/postgres"
)

// Two replicas: one issues shards to one gateway, one after another,
// while the other folds that gateway's fence row into the floor pass
// after pass (its clock a month ahead, so every gateway is quiet to it).
// Whatever the interleaving, the gateway's fences strictly increase (it
// is never handed one it held), some rows were folded, and the audit
// finds no two shards of the gateway sharing a fence.
func TestShardFenceFoldRacesIssuance(t *testing.T) {
	ctx := context.Background()
	first, dsn := openStore(t)
	second, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	now := time.Now().UTC()
	issuer := engine.New(first, engine.Options{DisableWorkers: true, Clock: func() time.Time { return now }})
	defer issuer.Close()
	folder := engine.New(second, engine.Options{DisableWorkers: true, Retention: time.Hour, RetentionPause: time.Millisecond,
		Clock: func() time.Time { return now.Add(30 * 24 * time.Hour) }})
	defer folder.Close()
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EmergencyMode: true}.WithDefaults()
	if res, err := issuer.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		t.Fatalf("publish: %+v %v", res, err)
	}
	_, key, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !done.Load() {
			if err := folder.RunRetention(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var last uint64
	for i := range 60 {
		res, err := issuer.Do(ctx, ledger.Command{Kind: ledger.KindShardIssue, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
			Units: ledger.Amounts{1}, Shard: &ledger.ShardArgs{ShardID: fmt.Sprintf("sh-%d", i), GatewayID: "gw-race", BootEpoch: 1,
				TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
		if err != nil || res.Err != nil {
			t.Fatalf("issue %d: %+v %v", i, res, err)
		}
		if res.Shard.Fence <= last {
			t.Fatalf("issue %d: fence %d after %d", i, res.Shard.Fence, last)
		}
		last = res.Shard.Fence
	}
	done.Store(true)
	wg.Wait()
	if s := folder.RetentionStats(); s.FencesFolded == 0 {
		t.Fatalf("nothing folded: %+v", s)
	}
	discrepancies, err := issuer.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range discrepancies {
		t.Errorf("audit: %s", d)
	}
}
