package sim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Shard retention in the simulation: where the retention worker runs
// (sim/retention.go), each of its passes also runs the server's step over
// emergency shards, engine.Core.ShardsRemove with before = now - window,
// its transactions committed as the server's are (outside the batches).
// The checker follows every removal (shardRemoved): the shard must be one
// it saw committed, settled (reconciled, nothing unknown), ended (expired,
// or last reminted) at or before now - window, with no receipt its
// gateway still has to resolve; after it, no row and no remint move may
// name it again. The full audit runs after every pass that removed
// shards, and retainedShardsAudit compares the store's retained shard
// totals with the checker's own sums of the removed rows. A gateway may
// send its last submission for a removed shard again (a late
// resubmission): it must be answered SHARD_NOT_FOUND, moving nothing.

// shardRemovePage is the page of reconciled shards one read of
// ShardsRemove takes (the server's is 64): small, so that passes span
// pages.
const shardRemovePage = 4

// removeShards runs the retention pass's shard step, also while deferred
// commits wait for their fsync: its transactions are Commits, which make
// those durable first, in the store and in the recording store alike
// (recTx.commit), so a crash after a removal never keeps it without the
// commits it was decided on.
func (w *world) removeShards() {
	n := &w.ledger
	if !w.shards.on {
		return
	}
	removed, err := n.core.ShardsRemove(w.ctx, w.time().Add(-w.retention.window), shardRemovePage, nil)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("engine.Core.ShardsRemove: %v", err))
		return
	}
	w.chk.afterCommit(nil)
	if w.fail != nil || removed == 0 {
		return
	}
	if int64(removed) != w.shards.removedCount-w.shards.countedRemovals {
		w.violate(GateRetention, fmt.Sprintf("engine.Core.ShardsRemove says it removed %d shards, the commits removed %d", removed, w.shards.removedCount-w.shards.countedRemovals))
		return
	}
	w.shards.countedRemovals = w.shards.removedCount
	w.log(recWorker, ledgerNodeID, 0, "", int64(removed), "shards removed")
	w.chk.fullAudit("after shard removal")
}

// shardRemoved checks a removal the checker saw committed.
func (w *world) shardRemoved(id string) {
	s := &w.shards
	key := s.key(id)
	row, ok := s.rows[key]
	if !ok || s.removed[key] {
		w.violate(GateRetention, fmt.Sprintf("retention removed shard %s, which was not stored (seen %v, removed before %v)", key, ok, s.removed[key]))
		return
	}
	ended := row.ExpiresAt
	if at := s.lastRemint[key]; at.After(ended) {
		ended = at
	}
	cutoff := w.time().Add(-w.retention.window)
	switch {
	case !w.retention.on:
		w.violate(GateRetention, fmt.Sprintf("shard %s removed with the retention worker off", id))
	case !row.Reconciled || row.Unknown != (ledger.Amounts{}):
		w.violate(GateRetention, fmt.Sprintf("retention removed shard %s, which was not settled: reconciled %v, unknown %v", id, row.Reconciled, row.Unknown))
	case ended.After(cutoff):
		w.violate(GateRetention, fmt.Sprintf("retention removed shard %s, which ended at %s, after now - window %s", id,
			ended.Sub(epoch0), cutoff.Sub(epoch0)))
	}
	if w.fail != nil {
		return
	}
	sh := s.byLife[key]
	if sh != nil && sh.local != nil && !sh.submitting {
		if _, pending := sh.local.Reconciled(); pending > 0 {
			w.violate(GateRetention, fmt.Sprintf("retention removed shard %s while its gateway holds %d receipts left unknown with no submission in flight", id, pending))
			return
		}
	}
	s.removed[key] = true
	s.removedCount++
	s.reusable = append(s.reusable, id)
	s.removedAt[id] = w.now
	r := s.retained[row.Account]
	if r == nil {
		r = &ledger.RetainedShards{Account: row.Account}
		s.retained[row.Account] = r
	}
	r.Shards++
	r.Remints += s.moves[key]
	for d := range row.Allocated {
		r.Allocated[d] += row.Allocated[d]
		r.Spent[d] += row.Spent[d]
		r.Reminted[d] += row.Reminted[d]
	}
	if sh != nil && len(sh.subs) > 0 && w.chance(0.5) {
		// A late resubmission: the gateway's last submission once more.
		s.lateResends++
		w.log(recShard, w.gatewayNode(sh.gw), ledger.KindShardReconcile, id, int64(len(sh.subs)), "resubmits for a removed shard")
		w.send(&message{kind: msgCommand, from: w.gatewayNode(sh.gw), to: ledgerNodeID, owner: sh.idx, late: true, sub: int32(len(sh.subs)),
			cmd: ledger.Command{Kind: ledger.KindShardReconcile,
				Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gatewayID(sh.gw), Receipts: sh.subs[len(sh.subs)-1]}}})
	}
}

// shardRemovedApplied reports whether a SHARD_NOT_FOUND answer to
// submission sub (1 the first) of a removed shard is correct: an earlier
// copy of it was applied. It records a violation (returning false)
// otherwise.
func (w *world) shardRemovedApplied(sh *simShard, sub int) bool {
	if sub >= 1 && sub <= len(sh.subs) && w.shards.applied[sh.key] >= sub {
		return true
	}
	w.violate(GateRetention, fmt.Sprintf("shard reconcile %s submission %d answered SHARD_NOT_FOUND after retention removed the shard, "+
		"but the central row shows %d submissions applied", sh.id, sub, w.shards.applied[sh.key]))
	return false
}

// lateShardAnswer checks the answer to a late resubmission for a removed
// shard: SHARD_NOT_FOUND (shardChanges sees that no row and no move name
// the shard again).
func (w *world) lateShardAnswer(sh *simShard, m *message) {
	if m.kind != msgAnswer {
		return
	}
	if !errors.Is(m.res.Err, ledger.ErrShardNotFound) {
		w.violate(GateRetention, fmt.Sprintf("a resubmission for shard %s, which retention removed, answered %v, not %v", sh.id, m.res.Err, ledger.ErrShardNotFound))
	}
}

// retainedShardsAudit compares the store's retained shard totals with the
// sums of the rows the checker saw removed.
func (w *world) retainedShardsAudit(snap *ledger.Snapshot, why string) {
	s := &w.shards
	if len(snap.RetainedShards) != len(s.retained) {
		w.violate(GateShardConservation, fmt.Sprintf("%s: the store has retained shard totals for %d accounts, retention removed shards of %d",
			why, len(snap.RetainedShards), len(s.retained)))
		return
	}
	for i := range snap.RetainedShards {
		got := &snap.RetainedShards[i]
		want := s.retained[got.Account]
		if want == nil || *want != *got {
			w.violate(GateShardConservation, fmt.Sprintf("%s: retained shard totals of %s are %+v; the removed shards add up to %+v", why, got.Account, *got, want))
			return
		}
	}
}

// removedShardMeta checks that a commit writes no meta row of a removed
// shard (its remint count, refusals, receipts left unknown): the shard
// answers SHARD_NOT_FOUND and changes nothing.
func (w *world) removedShardMeta(ch *store.Changes) {
	for _, name := range sortedKeys(ch.Meta) {
		_, id, ok := strings.Cut(name, "/")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "shard_moves/"), strings.HasPrefix(name, "shard_refused/"):
		case strings.HasPrefix(name, "shard_unknown/"):
			id, _, _ = strings.Cut(id, "/")
		default:
			continue
		}
		if w.shards.removed[w.shards.key(id)] {
			w.violate(GateRetention, fmt.Sprintf("meta row %s = %d written after retention removed shard %s", name, ch.Meta[name], id))
			return
		}
	}
}

// lifeKey names life n of shard id in the checker's maps: the id itself
// for its first shard, "id#n" for the n-th shard issued under it again.
func lifeKey(id string, n int) string {
	if n == 0 {
		return id
	}
	return id + "#" + strconv.Itoa(n)
}

// key is the current life of shard id.
func (s *shardSim) key(id string) string { return lifeKey(id, s.life[id]) }

// remintLife returns the life of shard id that remint move receiptID
// names: ledger.ShardRemintReceipt carries the shard's issue time, which
// tells the shards under one id apart; a receipt without it (the legacy
// form) names the id's current life. It returns "" when the issue time is
// none of the id's shards'.
func (s *shardSim) remintLife(id, receiptID string) string {
	issued, ok := ledger.ShardRemintIssued(receiptID)
	if !ok {
		return s.key(id)
	}
	for n := s.life[id]; n >= 0; n-- {
		key := lifeKey(id, n)
		if row, seen := s.rows[key]; seen && row.IssuedAt.UnixNano() == issued {
			return key
		}
	}
	return ""
}

// reuseShardID picks, for a shard a gateway is about to ask for, the id
// of a shard that retention removed (docs/API.md: the id is free again),
// half the time while the shard_reuse site is enabled. Only an id the
// removed shard's gateway is done with qualifies: the old shard reconciled with nothing in flight,
// and removed longer ago than any message (a late resubmission, a
// duplicate) can still travel, so that nothing meant for the old shard
// reaches the new one.
func (w *world) reuseShardID() (string, bool) {
	s := &w.shards
	for i, id := range s.reusable {
		old := s.byLife[s.key(id)]
		if old == nil || old.phase != shDone || old.submitting || w.now-s.removedAt[id] <= shardQuietWait {
			continue
		}
		if !w.f.enabled[SiteShardReuse] || !w.chance(0.5) {
			return "", false
		}
		s.reusable = slices.Delete(s.reusable, i, i+1)
		return id, true
	}
	return "", false
}
