package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Journal compaction in the simulation: in some interleavings the ledger
// process runs the compaction worker's steps (engine.Engine.CutCheckpoint
// and CompactJournal, docs/OPERATIONS.md "Retention and compaction") every
// compactionSim.every of simulated time, at simulated instants of their
// own, so that batches commit between them and a crash can end a cut
// anywhere:
//
//  1. the cut: one Store.AuditSnapshot with its cut position, audited
//     since the last checkpoint by ledger.AuditWith, which cuts the next
//     checkpoint when the audit is clean (as engine.CutCheckpoint does,
//     without its pacing: that is the engine's goroutine and wall clock);
//  2. store.PutCheckpoint (Store.CheckpointWrite), a few milliseconds later;
//  3. Store.JournalCompact of 4-32 rows at a time, a few milliseconds
//     apart, until it deletes none.
//
// The crash_mid_cut site, drawn once per cut, kills the ledger process
// before step 2 or before one of the calls of step 3 (or, when the
// deletion ends sooner, before the checks that end the cut). The next
// process takes when it last cut from the store's last checkpoint
// (Store.CheckpointLast), as a restarted server's worker does
// (engine.runCompaction): it cuts when every has passed since that
// checkpoint, not at its first pass. (It used to cut at its first pass,
// which the engine did too: on a large ledger that is a checkpoint row
// per account at every deploy or crash loop.) A cut whose put was stored
// before the crash leaves its deletions to the next cut here; the
// engine's worker deletes at every pass, due or not, so it gets to them
// sooner. Either way no entry after the last checkpoint is deleted.
//
// The checker follows every step (GateCompaction): the stored checkpoint's
// closing vectors must be the balances the checker replayed from every
// commit up to the cut, and after every deletion the store's journal since
// the last checkpoint must still hold every entry committed after that
// cut. At the end of each cut, the full audit (checker.fullAudit) runs:
// the checkpoint chain verifies and the journal since the last checkpoint
// replays to every account.

// compactionSim is an interleaving's compaction worker.
type compactionSim struct {
	on bool
	// every is how often a checkpoint is cut; batch how many journal rows
	// one JournalCompact call deletes.
	every int64
	batch int
	// lastCut is when the current process last began a cut, or at a
	// restart when the store's last checkpoint was cut (-1: no
	// checkpoint stored, it cuts at its first worker pass).
	lastCut int64
	// busy is set while a cut is under way, by process incarnation; cp
	// is its checkpoint until stored (nil when the journal held nothing
	// new, then only the deletion is left), at what the checker had
	// seen committed at the cut: its entry count and every account's
	// balances.
	busy        bool
	incarnation int32
	cp          *ledger.Checkpoint
	cutEntries  int64
	cutBalances map[ledger.AccountKey]ledger.Balances
	// crashAt is the step before which crash_mid_cut kills the process
	// (-1: none); step counts the cut's steps (the put, then each
	// deletion), deletions its JournalCompact calls.
	crashAt, step, deletions int
	// cutAt maps each stored checkpoint's Seq to the checker's journal
	// entry count at its cut.
	cutAt map[int64]int64
	// Counters for the report.
	checkpoints, deleted, crashed int64
}

// compactionStepMin and compactionStepMax space a cut's steps.
const (
	compactionStepMin = int64(time.Millisecond)
	compactionStepMax = int64(30 * time.Millisecond)
)

func (w *world) drawCompaction() {
	if !w.chance(0.5) {
		return
	}
	w.compaction = compactionSim{
		on:      true,
		every:   w.between(int64(15*time.Second), int64(45*time.Second)),
		batch:   4 + w.rng.IntN(29),
		lastCut: -1,
		cutAt:   map[int64]int64{},
	}
}

// compactionTick runs from the worker tick: it begins a cut when one is
// due and none is under way.
func (w *world) compactionTick() {
	cs := &w.compaction
	if !cs.on || cs.busy || cs.lastCut >= 0 && w.now-cs.lastCut < cs.every {
		return
	}
	if len(w.ledger.st.unsynced) > 0 {
		return // the cut reads only durable commits (next tick)
	}
	n := &w.ledger
	cs.lastCut = w.now
	var (
		cp    *ledger.Checkpoint
		found []ledger.Discrepancy
	)
	err := w.ledgerStore.AuditSnapshot(w.ctx, true, func(snap *ledger.Snapshot, through int64) error {
		last := snap.LastCheckpoint()
		if through <= 0 || last != nil && through <= last.Through {
			return nil
		}
		found, cp = ledger.AuditWith(snap, ledger.AuditOptions{SinceCheckpoint: true, Cut: through, CutAt: w.time()})
		return nil
	})
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("compaction: AuditSnapshot: %v", err))
		return
	}
	for _, d := range found {
		w.violate(auditGate(d), fmt.Sprintf("compaction: the audit before a cut: %s", d))
		return
	}
	cs.busy, cs.incarnation, cs.cp, cs.step, cs.deletions, cs.crashAt = true, n.incarnation, cp, 0, 0, -1
	if w.f.fire(SiteCrashMidCut) {
		// Before the put or the 1st-3rd deletion (without a checkpoint
		// to store, before the 1st-3rd deletion).
		cs.crashAt = w.rng.IntN(3)
		if cp != nil {
			cs.crashAt = w.rng.IntN(4)
		}
	}
	cs.cutEntries = w.chk.entries
	cs.cutBalances = make(map[ledger.AccountKey]ledger.Balances, len(w.chk.order))
	for _, k := range w.chk.order {
		cs.cutBalances[k] = w.chk.accounts[k].bal
	}
	seq, through := int64(0), int64(0)
	if cp != nil {
		seq, through = cp.Seq, cp.Through
	}
	w.log(recCompaction, ledgerNodeID, 0, "", seq, fmt.Sprintf("cut through %d", through))
	w.after(w.between(compactionStepMin, compactionStepMax), evCompaction, n.incarnation, 0, 0)
}

// compactionStep is the next step of the cut under way: store its
// checkpoint, or delete the next journal rows.
func (w *world) compactionStep(incarnation int32) {
	cs := &w.compaction
	n := &w.ledger
	if !cs.busy || cs.incarnation != incarnation || !n.up || n.incarnation != incarnation {
		return // the process died mid-cut
	}
	if len(n.st.unsynced) > 0 {
		// The checks compare the store with the durable commits.
		w.after(w.between(compactionStepMin, compactionStepMax), evCompaction, incarnation, 0, 0)
		return
	}
	if cs.step == cs.crashAt {
		cs.crashed++
		if cs.cp != nil {
			w.crashLedger(fmt.Sprintf("mid-cut, before storing checkpoint %d", cs.cp.Seq))
		} else {
			w.crashLedger(fmt.Sprintf("mid-cut, before journal deletion %d", cs.deletions+1))
		}
		return
	}
	cs.step++
	if cp := cs.cp; cp != nil {
		if err := store.PutCheckpoint(w.ctx, w.ledgerStore, cp); err != nil {
			w.violate(GateCompaction, fmt.Sprintf("PutCheckpoint %d: %v", cp.Seq, err))
			return
		}
		cs.cp = nil
		cs.checkpoints++
		cs.cutAt[cp.Seq] = cs.cutEntries
		w.log(recCompaction, ledgerNodeID, 0, "", cp.Seq, "checkpoint stored")
		w.checkCheckpoint(cp.Seq)
		if w.fail == nil {
			w.after(w.between(compactionStepMin, compactionStepMax), evCompaction, incarnation, 0, 0)
		}
		return
	}
	cs.deletions++
	deleted, err := w.ledgerStore.JournalCompact(w.ctx, cs.batch)
	if err != nil {
		w.violate(GateCompaction, fmt.Sprintf("JournalCompact: %v", err))
		return
	}
	cs.deleted += int64(deleted)
	w.log(recCompaction, ledgerNodeID, 0, "", int64(deleted), "journal rows deleted")
	if deleted > 0 || cs.step <= cs.crashAt {
		// More to delete (or the drawn crash still to come: it then
		// strikes before the checks below).
		w.after(w.between(compactionStepMin, compactionStepMax), evCompaction, incarnation, 0, 0)
		return
	}
	cs.busy, cs.cutBalances = false, nil
	snap, err := w.ledgerStore.Snapshot(w.ctx)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("after compaction: snapshot: %v", err))
		return
	}
	w.checkJournalSince(snap, "after compaction")
	if w.fail == nil {
		w.chk.auditSnapshot(snap, "after compaction")
	}
}

// checkCheckpoint checks the stored last checkpoint, seq, against the
// checker: its closing vector of every account is the balances the
// checker replayed from every commit up to the cut (zero for an account
// without entries then), and it names no account the checker never saw.
func (w *world) checkCheckpoint(seq int64) {
	snap, err := w.ledgerStore.Snapshot(w.ctx)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("after checkpoint %d: snapshot: %v", seq, err))
		return
	}
	last := snap.LastCheckpoint()
	if last == nil || last.Seq != seq {
		w.violate(GateCompaction, fmt.Sprintf("checkpoint %d was stored, the store's last is %+v", seq, last))
		return
	}
	bal := w.compaction.cutBalances
	for i := range last.Accounts {
		if _, ok := bal[last.Accounts[i].Account]; !ok {
			w.violate(GateCompaction, fmt.Sprintf("checkpoint %d closes account %s, which no commit before its cut touched", seq, last.Accounts[i].Account))
			return
		}
	}
	for _, k := range w.chk.order {
		want, ok := bal[k]
		if !ok {
			continue // created after the cut
		}
		var got ledger.Balances
		i, found := slices.BinarySearchFunc(last.Accounts, k, func(a ledger.CheckpointAccount, k ledger.AccountKey) int { return a.Account.Compare(k) })
		if found {
			got = last.Accounts[i].Balances
		}
		if got != want {
			dims := w.chk.accounts[k].dims
			w.violate(GateCompaction, fmt.Sprintf("checkpoint %d closes account %s at %+v, but the commits up to its cut replay to %+v",
				seq, k, got[:dims], want[:dims]))
			return
		}
	}
}

// checkJournalSince checks that snap's journal since its last
// checkpoint holds every entry committed after that checkpoint's cut:
// compaction deleted only what the checkpoint summarises.
func (w *world) checkJournalSince(snap *ledger.Snapshot, why string) {
	last := snap.LastCheckpoint()
	if last == nil {
		return
	}
	at, ok := w.compaction.cutAt[last.Seq]
	if !ok {
		w.violate(GateCompaction, fmt.Sprintf("%s: the store's last checkpoint %d was never stored by the compaction worker", why, last.Seq))
		return
	}
	if got, want := int64(len(snap.Journal)), w.chk.entries-at; got != want {
		w.violate(GateCompaction, fmt.Sprintf("%s: the journal since checkpoint %d holds %d entries, %d were committed after its cut",
			why, last.Seq, got, want))
	}
}

// lastStoredCut returns when the store's last checkpoint was cut, in
// simulated nanoseconds, or -1 when none is stored: what a restarted
// process's compaction worker starts from (engine.runCompaction).
func (w *world) lastStoredCut() int64 {
	c, ok, err := w.ledgerStore.CheckpointLast(w.ctx)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("compaction: CheckpointLast: %v", err))
		return -1
	}
	if !ok {
		return -1
	}
	return int64(c.CutAt.Sub(epoch0))
}
