package storetest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// shardRetentionCases are the checks of the retention of emergency
// shards, run by Run.
var shardRetentionCases = []struct {
	name string
	f    func(t *testing.T, s store.Store)
}{
	{"ShardRetention", testShardRetention},
	{"ShardRetentionConcurrentReplicas", testShardRetentionConcurrent},
	{"ShardRetentionEdges", testShardRetentionEdges},
	{"ShardRetentionRemintsAndLegacyEnds", testShardRetentionRemintsAndLegacyEnds},
}

// removeShardsBefore runs what the engine's Core.ShardsRemove runs
// (removeShards) and fails t on an error.
func removeShardsBefore(t *testing.T, s store.Store, before time.Time, page int) int {
	t.Helper()
	n, err := removeShards(context.Background(), s, before, page)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// removeShards runs what the engine's Core.ShardsRemove runs: pages of
// ShardsReconciled after a cursor, each shard's receipt counters
// (MetaNames), and ledger.RemoveShards in a transaction per page. It
// returns how many shards were removed.
func removeShards(ctx context.Context, s store.Store, before time.Time, page int) (int, error) {
	removed := 0
	var after store.ShardCursor
	for {
		shards, err := s.ShardsReconciled(ctx, after, before, page)
		if err != nil {
			return removed, fmt.Errorf("reconciled shards: %w", err)
		}
		if len(shards) == 0 {
			return removed, nil
		}
		after = store.ShardCursor{ExpiresAt: shards[len(shards)-1].ExpiresAt, ID: shards[len(shards)-1].ID}
		var ids []string
		unknown := map[string][]string{}
		for i := range shards {
			names, err := s.MetaNames(ctx, ledger.ShardUnknownPrefix(shards[i].ID), 100)
			if err != nil {
				return removed, fmt.Errorf("receipt counters of %s: %w", shards[i].ID, err)
			}
			ids, unknown[shards[i].ID] = append(ids, shards[i].ID), names
		}
		n, err := removeShardsTx(ctx, s, ids, before, unknown)
		if err != nil {
			return removed, err
		}
		removed += n
		if len(shards) < page {
			return removed, nil
		}
	}
}

func removeShardsTx(ctx context.Context, s store.Store, ids []string, before time.Time, unknown map[string][]string) (int, error) {
	tx, err := s.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	book := store.NewBook(ctx, tx, 0)
	n := ledger.RemoveShards(book, ids, before, unknown)
	if err := book.Err(); err != nil {
		return 0, err
	}
	if c := book.Changes(); !c.Empty() {
		if err := tx.Write(ctx, c); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return n, nil
}

// Replicas removing the same shards at once (a lease handover): each
// shard is removed, and folded into the retained totals, exactly once;
// a pass that lost a race (ErrConflict) is run again, as the next
// retention pass would.
func testShardRetentionConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	key := ledger.PolicyKey{Subject: "tenant-sc", Route: "chat", Region: "eu"}
	policy := ledger.Policy{Key: key, EmergencyMode: true,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 10_000, RefillUnits: 1, RefillInterval: time.Hour}}}.WithDefaults()
	_, signKey, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
	run := func(cmd ledger.Command) ledger.Result {
		t.Helper()
		res, err := apply(ctx, s, &cmd, now)
		if err != nil || res.Err != nil {
			t.Fatalf("%s: %+v, %v", cmd.Kind, res, err)
		}
		return res
	}
	gen := run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}).Generation
	const shards = 24
	for i := range shards {
		id := fmt.Sprintf("sh-%02d", i)
		run(ledger.Command{Kind: ledger.KindShardIssue, Subject: key.Subject, Route: key.Route, Region: key.Region,
			Units: ledger.Amounts{10}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw", BootEpoch: 1,
				TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(signKey)}})
		run(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw",
			Receipts: []ledger.ShardReceipt{{ReservationID: "r", State: ledger.StateSettled, Actual: ledger.Amounts{4}}}}})
	}
	before := now.Add(time.Hour)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for attempt := 0; attempt < 100; attempt++ {
				n, err := removeShards(ctx, s, before, 5)
				mu.Lock()
				total += n
				mu.Unlock()
				if err == nil {
					return
				}
				if !errors.Is(err, store.ErrConflict) {
					errs <- err
					return
				}
			}
			errs <- errors.New("still conflicting after 100 passes")
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if total != shards {
		t.Fatalf("replicas removed %d shards in all, want %d", total, shards)
	}
	account := ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: gen}
	same(t, "retained shards", auditClean(t, s).RetainedShards, []ledger.RetainedShards{{Account: account, Shards: shards, Remints: shards,
		Allocated: ledger.Amounts{10 * shards}, Spent: ledger.Amounts{4 * shards}, Reminted: ledger.Amounts{6 * shards}}})
}

// testShardRetention: retention removes exactly the settled shards
// (reconciled, nothing unknown, no receipt left pending) that ended (their
// expiry, or their last remint when later) at or before the cutoff, with
// their meta rows; it keeps shards live, unreconciled, holding unknown
// work, or with a receipt left unknown that holds nothing. The audit, of
// the snapshot and of the streamed one, adds the removed shards' retained
// totals up exactly, and still reports a retained total or a remint move
// planted after the removal. A reconciliation sent again for a removed
// shard is ErrShardNotFound and reminds nothing.
func testShardRetention(t *testing.T, s store.Store) {
	ctx := context.Background()
	start := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	f := newShardFixture(t, s, "tenant-sr", start)
	issue, reconcile := f.issue, f.reconcile
	gen := f.gen
	account := ledger.AccountKey{Subject: f.key.Subject, Route: f.key.Route, Region: f.key.Region, Generation: gen}
	settled := func(id string, used ledger.Units) ledger.ShardReceipt {
		return ledger.ShardReceipt{ReservationID: id, State: ledger.StateSettled, Reserved: ledger.Amounts{used}, Actual: ledger.Amounts{used}}
	}
	unknownHold := func(id string, held ledger.Units) ledger.ShardReceipt {
		return ledger.ShardReceipt{ReservationID: id, State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{held}}
	}
	for _, id := range []string{"sh-a", "sh-b", "sh-c", "sh-d", "sh-e", "sh/f", "sh-late"} {
		issue(id, 100)
	}
	f.now = start.Add(2 * time.Minute)                                                      // every shard expired
	reconcile("sh-a", settled("a1", 30))                                                    // reminted 70
	reconcile("sh-b", unknownHold("b1", 20), settled("b2", 10))                             // reminted 70, 20 unknown
	reconcile("sh-b", settled("b1", 5))                                                     // resolved: reminted 15 more
	reconcile("sh-c", ledger.ShardReceipt{ReservationID: "c1", State: ledger.StateStarted}) // pending, holding nothing
	reconcile("sh-d", unknownHold("d1", 10))                                                // 10 unknown
	reconcile("sh/f", settled("f1", 100))                                                   // nothing reminted: no move
	if res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindShardReconcile,
		Shard: &ledger.ShardArgs{ShardID: "sh-a", GatewayID: "gw-1"}}, f.now); err != nil || !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) {
		t.Fatalf("second submission: %+v %v", res, err) // counted in shard_refused/sh-a
	}
	f.now = start.Add(30 * time.Minute)
	reconcile("sh-late", settled("l1", 40)) // reminted 60, a move at +30m
	auditClean(t, s)

	// The candidates: reconciled shards by expiry, then id, in pages.
	var listed []string
	var after store.ShardCursor
	for {
		page, err := s.ShardsReconciled(ctx, after, start.Add(time.Hour), 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range page {
			listed = append(listed, sh.ID)
		}
		if len(page) < 2 {
			break
		}
		after = store.ShardCursor{ExpiresAt: page[1].ExpiresAt, ID: page[1].ID}
	}
	sameIDs(t, "reconciled shards", listed, []string{"sh-a", "sh-b", "sh-c", "sh-d", "sh/f", "sh-late"})
	if none, err := s.ShardsReconciled(ctx, store.ShardCursor{}, start, 10); err != nil || len(none) != 0 {
		t.Fatalf("reconciled shards expiring before the first expiry: %v %v", none, err)
	}
	if _, err := s.ShardsReconciled(ctx, store.ShardCursor{}, start, 0); err == nil {
		t.Error("ShardsReconciled with limit 0: no error")
	}
	names, err := s.MetaNames(ctx, ledger.ShardUnknownPrefix("sh-b"), 10)
	sameIDs(t, "sh-b's receipt counters", names, []string{ledger.MetaShardReceipt("sh-b", "b1"), ledger.MetaShardReceipt("sh-b", "b1") + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.MetaNames(ctx, "shard_unknown/", 0); err == nil {
		t.Error("MetaNames with limit 0: no error")
	}

	accountBefore, err := s.AccountGet(ctx, account)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing ended by the first expiry; by +90s only sh/f (no remint):
	// the others' remints came at +2m.
	if n := removeShardsBefore(t, s, start.Add(time.Minute), 10); n != 0 {
		t.Fatalf("removed %d shards before anything ended", n)
	}
	if n := removeShardsBefore(t, s, start.Add(90*time.Second), 10); n != 1 {
		t.Fatalf("removed %d shards by +90s, want sh/f", n)
	}
	if n := removeShardsBefore(t, s, start.Add(10*time.Minute), 1); n != 2 {
		t.Fatalf("removed %d shards by +10m, want sh-a and sh-b", n)
	}
	for _, id := range []string{"sh-a", "sh-b", "sh/f"} {
		_, err := s.ShardGet(ctx, id)
		mustNotFound(t, "removed shard "+id, err)
	}
	for _, id := range []string{"sh-c", "sh-d", "sh-e", "sh-late"} {
		if _, err := s.ShardGet(ctx, id); err != nil {
			t.Errorf("kept shard %s: %v", id, err)
		}
	}
	for _, name := range []string{"shard_moves/sh-a", "shard_moves/sh-b", ledger.MetaShardRefusedFor("sh-a"), ledger.MetaShardReceipt("sh-b", "b1"),
		ledger.MetaShardReceipt("sh-b", "b1") + "/0"} {
		if v, found := metaOf(t, s, name); found {
			t.Errorf("meta row %s of a removed shard is left: %d", name, v)
		}
	}
	if v, found := metaOf(t, s, ledger.MetaShardReceipt("sh-c", "c1")); !found || ledger.ShardReceiptStandingOf(v) != ledger.ShardReceiptPending {
		t.Errorf("kept shard's pending receipt: %d %v", v, found)
	}
	if v, found := metaOf(t, s, ledger.MetaShardRemints); !found || v != 6 {
		t.Errorf("remints counter: %d %v, want all 6 remints counted", v, found)
	}
	want := []ledger.RetainedShards{{Account: account, Shards: 3, Remints: 3,
		Allocated: ledger.Amounts{300}, Spent: ledger.Amounts{30 + 15 + 100}, Reminted: ledger.Amounts{70 + 85}}}
	snap := auditClean(t, s)
	same(t, "retained shards", snap.RetainedShards, want)
	if n := removeShardsBefore(t, s, start.Add(40*time.Minute), 10); n != 1 {
		t.Fatalf("removed %d shards by +40m, want sh-late", n)
	}
	want[0].Shards, want[0].Remints, want[0].Allocated[0], want[0].Spent[0], want[0].Reminted[0] = 4, 4, 400, 185, 215
	same(t, "retained shards", auditClean(t, s).RetainedShards, want)
	if n := removeShardsBefore(t, s, start.Add(time.Hour), 10); n != 0 {
		t.Fatalf("a second pass removed %d", n)
	}
	streamed := func() []ledger.Discrepancy {
		t.Helper()
		var out []ledger.Discrepancy
		if err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			out = ledger.Audit(snap)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, d := range streamed() {
		t.Errorf("streamed audit: %s", d)
	}

	// A reconciliation sent again for a removed shard: not found, and
	// nothing is reminted twice.
	res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindShardReconcile,
		Shard: &ledger.ShardArgs{ShardID: "sh-a", GatewayID: "gw-1", Receipts: []ledger.ShardReceipt{settled("a1", 30)}}}, f.now)
	if err != nil || !errors.Is(res.Err, ledger.ErrShardNotFound) || res.Move != nil {
		t.Fatalf("reconcile of a removed shard: %+v %v", res, err)
	}
	accountAfter, err := s.AccountGet(ctx, account)
	if err != nil {
		t.Fatal(err)
	}
	if accountAfter.Balances[0] != accountBefore.Balances[0] {
		t.Fatalf("removal or a replay changed the account: %+v, was %+v", accountAfter.Balances[0], accountBefore.Balances[0])
	}

	// Planted after the removal: a retained total that no longer adds up,
	// then a second remint move under a removed shard's name.
	allocated := "shard_retained/tenant-sr/chat/eu/" + itoa(gen) + "/allocated/0"
	if v, found := metaOf(t, s, allocated); !found || v != 400 {
		t.Fatalf("retained allocated row %s: %d %v", allocated, v, found)
	}
	Commit(t, s, &store.Changes{Meta: map[string]int64{allocated: 401}})
	wantCheck(t, "planted retained allocation", ledger.Audit(mustSnapshot(t, s)), ledger.CheckShard)
	wantCheck(t, "planted retained allocation, streamed", streamed(), ledger.CheckShard)
	Commit(t, s, &store.Changes{Meta: map[string]int64{allocated: 400}})
	auditClean(t, s)
	spent := "shard_retained/tenant-sr/chat/eu/" + itoa(gen) + "/spent/0"
	Commit(t, s, &store.Changes{Meta: map[string]int64{spent: 184}})
	wantCheck(t, "planted retained spent", ledger.Audit(mustSnapshot(t, s)), ledger.CheckShard)
	Commit(t, s, &store.Changes{Meta: map[string]int64{spent: 185}})
	auditClean(t, s)
	Commit(t, s, &store.Changes{Moves: []ledger.Move{{ReceiptID: ledger.LegacyShardRemintReceipt("sh-a", 2), Kind: ledger.MoveShardRemint,
		From: account, To: account, Units: ledger.Amounts{1}, At: f.now}}})
	wantCheck(t, "planted remint of a removed shard", ledger.Audit(mustSnapshot(t, s)), ledger.CheckShardRemint)
	wantCheck(t, "planted remint of a removed shard, streamed", streamed(), ledger.CheckShardRemint)
	// Counted as well (5 remints): the moves now mint a unit more than
	// the removed shards confirmed unused.
	Commit(t, s, &store.Changes{Meta: map[string]int64{"shard_retained/tenant-sr/chat/eu/" + itoa(gen) + "/remints": 5}})
	wantCheck(t, "planted counted remint of a removed shard", ledger.Audit(mustSnapshot(t, s)), ledger.CheckShardRemint)
}

// shardFixture is an emergency-mode policy for one subject, published at
// a test's start, and the shard commands the retention tests apply at now,
// each a second after the last (a test moves now on to expire shards).
type shardFixture struct {
	t       *testing.T
	s       store.Store
	key     ledger.PolicyKey
	gen     uint64
	now     time.Time
	signKey ed25519.PrivateKey
}

func newShardFixture(t *testing.T, s store.Store, subject string, start time.Time) *shardFixture {
	_, signKey, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
	f := &shardFixture{t: t, s: s, key: ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"}, now: start, signKey: signKey}
	policy := ledger.Policy{Key: f.key, EmergencyMode: true,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: time.Hour}}}.WithDefaults()
	f.gen = f.run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}).Generation
	return f
}

// run applies cmd at now, which it must succeed at, and moves now a second on.
func (f *shardFixture) run(cmd ledger.Command) ledger.Result {
	f.t.Helper()
	res, err := apply(context.Background(), f.s, &cmd, f.now)
	if err != nil || res.Err != nil {
		f.t.Fatalf("%s at %s: %+v, %v", cmd.Kind, f.now, res, err)
	}
	f.now = f.now.Add(time.Second)
	return res
}

// issue issues shard id of units tokens to gw-1, for a minute.
func (f *shardFixture) issue(id string, units ledger.Units) {
	f.t.Helper()
	f.run(ledger.Command{Kind: ledger.KindShardIssue, Subject: f.key.Subject, Route: f.key.Route, Region: f.key.Region,
		Units: ledger.Amounts{units}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw-1", BootEpoch: 1,
			TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(f.signKey)}})
}

// reconcile submits receipts for gw-1's shard id.
func (f *shardFixture) reconcile(id string, receipts ...ledger.ShardReceipt) ledger.Result {
	f.t.Helper()
	return f.run(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw-1", Receipts: receipts}})
}

func itoa(v uint64) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + v%10)}, b...)
		if v /= 10; v == 0 {
			return string(b)
		}
	}
}

func mustSnapshot(t *testing.T, s store.Store) *ledger.Snapshot {
	t.Helper()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// wantCheck fails unless ds holds a discrepancy of check.
func wantCheck(t *testing.T, what string, ds []ledger.Discrepancy, check string) {
	t.Helper()
	for _, d := range ds {
		if d.Check == check {
			return
		}
	}
	t.Errorf("%s: audit found %v, want a %s discrepancy", what, ds, check)
}

// testShardRetentionEdges: ShardsReconciled lists no unreconciled shard,
// and RemoveShards takes a settled shard that ended
// exactly at the cutoff, and leaves alone, even when asked for by id, a
// shard that is not reconciled, one whose record does not add up
// (spent + reminted short of allocated with nothing unknown), and a
// legacy budget returned whole: the audit keeps reading those.
func testShardRetentionEdges(t *testing.T, s store.Store) {
	ctx := context.Background()
	start := time.Date(2026, 7, 20, 9, 0, 0, 0, time.UTC)
	f := newShardFixture(t, s, "tenant-se", start)
	ids := []string{"se-edge", "se-unreconciled", "se-short", "se-legacy"}
	for _, id := range ids {
		f.issue(id, 100)
	}
	f.now = start.Add(2 * time.Minute)
	f.reconcile("se-edge", ledger.ShardReceipt{ReservationID: "e1", State: ledger.StateSettled, Reserved: ledger.Amounts{100}, Actual: ledger.Amounts{100}})
	edge, err := s.ShardGet(ctx, "se-edge")
	if err != nil {
		t.Fatal(err)
	}
	if !ledger.ShardSettled(&edge) || edge.Reminted != (ledger.Amounts{}) {
		t.Fatalf("se-edge after its reconciliation: %+v, want settled with nothing reminted (no move)", edge)
	}

	// Records only a broken writer (or a hand edit) leaves, planted as rows.
	plant := func(id string, edit func(sh *ledger.Shard)) {
		t.Helper()
		sh, err := s.ShardGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		edit(&sh)
		Commit(t, s, &store.Changes{Shards: []ledger.Shard{sh}})
	}
	plant("se-unreconciled", func(sh *ledger.Shard) { sh.Spent[0], sh.Reminted[0] = 40, 60 })
	plant("se-short", func(sh *ledger.Shard) { sh.Reconciled, sh.Spent[0], sh.Reminted[0] = true, 30, 60 })
	plant("se-legacy", func(sh *ledger.Shard) {
		sh.GatewayID, sh.Reconciled, sh.Reminted[0] = ledger.LegacyGateway("limiter-1"), true, 100
	})

	// The first page of candidates (no cursor) holds only reconciled
	// shards, in expiry order.
	var listed []string
	page, err := s.ShardsReconciled(ctx, store.ShardCursor{}, start.Add(time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range page {
		listed = append(listed, sh.ID)
	}
	sameIDs(t, "reconciled shards", listed, []string{"se-edge", "se-short", "se-legacy"})
	// MetaNames reads the prefix's key range, without its end
	// (store.PrefixEnd: "/" + 1 is "0").
	Commit(t, s, &store.Changes{Meta: map[string]int64{"se_names/a": 1, "se_names0": 1, "se_names.": 1}})
	names, err := s.MetaNames(ctx, "se_names/", 10)
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "meta names of se_names/", names, []string{"se_names/a"})

	// The cutoff is inclusive: a shard that ended at it is due (the
	// others expire a second and more later).
	if n := removeShardsBefore(t, s, edge.ExpiresAt.Add(-time.Nanosecond), 10); n != 0 {
		t.Fatalf("removed %d shards a nanosecond before se-edge ended", n)
	}
	if n := removeShardsBefore(t, s, edge.ExpiresAt, 10); n != 1 {
		t.Fatalf("removed %d shards at the moment se-edge ended, want se-edge", n)
	}
	_, err = s.ShardGet(ctx, "se-edge")
	mustNotFound(t, "removed shard se-edge", err)

	// A transaction reads its own removal; a rollback keeps the row.
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{RemovedShards: []string{"se-short"}}); err != nil {
		t.Fatal(err)
	}
	_, err = tx.ShardGet(ctx, "se-short")
	mustNotFound(t, "shard se-short after its removal in the same transaction", err)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := removeShardsTx(ctx, s, ids[1:], start.Add(time.Hour), nil); err != nil || n != 0 {
		t.Fatalf("removed %d (%v) of the shards the audit reads", n, err)
	}
	for _, id := range ids[1:] {
		if _, err := s.ShardGet(ctx, id); err != nil {
			t.Errorf("kept shard %s: %v", id, err)
		}
	}
}

// testShardRetentionRemintsAndLegacyEnds: the audit holds the remint
// moves of removed shards to the count their retained totals keep, both
// ways (a counted move missing, a move beyond the count that mints
// nothing but charges debt); a shard whose last remint is a legacy
// receipt ("shard-remint:ID:N", made before receipts carried the issue
// time) ended at that remint, not at its expiry; and a record with a
// negative spend is left for the audit, not removed.
func testShardRetentionRemintsAndLegacyEnds(t *testing.T, s store.Store) {
	ctx := context.Background()
	start := time.Date(2026, 7, 21, 9, 0, 0, 0, time.UTC)
	f := newShardFixture(t, s, "tenant-sl", start)
	account := ledger.AccountKey{Subject: f.key.Subject, Route: f.key.Route, Region: f.key.Region, Generation: f.gen}
	for _, id := range []string{"sl-a", "sl-legacy", "sl-negative"} {
		f.issue(id, 100)
	}
	f.now = start.Add(2 * time.Minute)
	f.reconcile("sl-a", ledger.ShardReceipt{ReservationID: "a1", State: ledger.StateSettled, Reserved: ledger.Amounts{30}, Actual: ledger.Amounts{30}})
	if n := removeShardsBefore(t, s, start.Add(10*time.Minute), 10); n != 1 {
		t.Fatalf("removed %d shards, want sl-a", n)
	}
	auditClean(t, s)
	remints := "shard_retained/tenant-sl/chat/eu/" + itoa(f.gen) + "/remints"
	if v, found := metaOf(t, s, remints); !found || v != 1 {
		t.Fatalf("retained remints %s: %d %v, want 1", remints, v, found)
	}
	Commit(t, s, &store.Changes{Meta: map[string]int64{remints: 2}})
	wantCheck(t, "a counted remint move of a removed shard missing", ledger.Audit(mustSnapshot(t, s)), ledger.CheckShardRemint)
	Commit(t, s, &store.Changes{Meta: map[string]int64{remints: 1}})
	auditClean(t, s)
	Commit(t, s, &store.Changes{Moves: []ledger.Move{{ReceiptID: "shard-remint:sl-a:2", Kind: ledger.MoveShardRemint,
		From: account, To: account, Debt: ledger.Amounts{5}, At: f.now}}})
	wantCheck(t, "an uncounted remint move of a removed shard, minting nothing", ledger.Audit(mustSnapshot(t, s)), ledger.CheckShardRemint)

	// Legacy data, planted as rows: sl-legacy reconciled (60 unused) by a
	// remint 10 minutes after its expiry, under the legacy receipt.
	legacy, err := s.ShardGet(ctx, "sl-legacy")
	if err != nil {
		t.Fatal(err)
	}
	remintAt := legacy.ExpiresAt.Add(10 * time.Minute)
	legacy.Reconciled, legacy.Spent[0], legacy.Reminted[0] = true, 40, 60
	Commit(t, s, &store.Changes{Shards: []ledger.Shard{legacy},
		Moves: []ledger.Move{{ReceiptID: "shard-remint:sl-legacy:1", Kind: ledger.MoveShardRemint, From: account, To: account,
			Units: ledger.Amounts{60}, At: remintAt}},
		Meta: map[string]int64{"shard_moves/sl-legacy": 1}})
	if n := removeShardsBefore(t, s, remintAt.Add(-time.Second), 10); n != 0 {
		t.Fatalf("removed %d shards before sl-legacy's legacy remint (ended then, not at its expiry)", n)
	}
	if n := removeShardsBefore(t, s, remintAt, 10); n != 1 {
		t.Fatalf("removed %d shards at sl-legacy's legacy remint, want sl-legacy", n)
	}
	_, err = s.ShardGet(ctx, "sl-legacy")
	mustNotFound(t, "removed shard sl-legacy", err)

	// A store that takes the negative spend (PostgreSQL's CHECK refuses
	// it) keeps the shard for the audit.
	negative, err := s.ShardGet(ctx, "sl-negative")
	if err != nil {
		t.Fatal(err)
	}
	negative.Reconciled, negative.Spent[0], negative.Reminted[0] = true, -10, 110
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if tx.Write(ctx, &store.Changes{Shards: []ledger.Shard{negative}}) != nil || tx.Commit(ctx) != nil {
		return
	}
	if n := removeShardsBefore(t, s, remintAt, 10); n != 0 {
		t.Errorf("removed %d shards: sl-negative, spending -10, want it kept for the audit", n)
	}
}
