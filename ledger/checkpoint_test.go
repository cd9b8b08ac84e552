package ledger_test

import (
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// compacted is snap as a store holds it once a checkpoint summarised the
// first cut entries and compaction deleted them.
func compacted(snap *ledger.Snapshot, chain []ledger.Checkpoint, cut int) *ledger.Snapshot {
	out := *snap
	out.Checkpoints = chain
	out.Journal = snap.Journal[cut:]
	return &out
}

func hasCheck(found []ledger.Discrepancy, check string) bool {
	for _, d := range found {
		if d.Check == check {
			return true
		}
	}
	return false
}

// A checkpoint cut by a clean audit replaces the journal before it: the
// audit of the compacted ledger is clean at every cut, and a second
// checkpoint extends the chain.
func TestCheckpointReplacesTheJournal(t *testing.T) {
	snap := soundLedger(t).Snapshot()
	at := time.Date(2026, 7, 20, 0, 0, 0, 0, time.UTC)
	for _, cut := range []int{1, len(snap.Journal) / 2, len(snap.Journal)} {
		found, cp := ledger.AuditWith(snap, ledger.AuditOptions{Cut: int64(cut), CutAt: at})
		if len(found) > 0 || cp == nil {
			t.Fatalf("cut at %d: %v, checkpoint %v", cut, found, cp != nil)
		}
		if cp.Seq != 1 || cp.Entries != int64(cut) || cp.Through != int64(cut) {
			t.Fatalf("cut at %d: %+v", cut, cp.Header())
		}
		small := compacted(snap, []ledger.Checkpoint{*cp}, cut)
		if d := ledger.Audit(small); len(d) > 0 {
			t.Fatalf("audit after compaction at %d: %v", cut, d)
		}
		if d, _ := ledger.AuditWith(small, ledger.AuditOptions{SinceCheckpoint: true}); len(d) > 0 {
			t.Fatalf("since-checkpoint audit after compaction at %d: %v", cut, d)
		}
		if cut == len(snap.Journal) {
			if cp.Moves != int64(len(snap.Moves)) || len(snap.Moves) == 0 {
				t.Fatalf("a checkpoint of the whole journal summarises %d moves of %d", cp.Moves, len(snap.Moves))
			}
			continue
		}
		// The next checkpoint, from the compacted ledger, extends the chain.
		_, next := ledger.AuditWith(small, ledger.AuditOptions{Cut: int64(len(snap.Journal)), CutAt: at.Add(time.Hour)})
		if next == nil || next.Seq != 2 || next.Prev != cp.Digest || next.Entries != int64(len(snap.Journal)) {
			t.Fatalf("second checkpoint after a cut at %d: %+v", cut, next)
		}
		whole := compacted(snap, []ledger.Checkpoint{cp.Header(), *next}, len(snap.Journal))
		if d := ledger.Audit(whole); len(d) > 0 {
			t.Fatalf("audit of a two-checkpoint chain: %v", d)
		}
	}
}

// The checkpoint checks can fail: each case breaks one link and expects
// the check named for it; an unsound ledger gets no checkpoint.
func TestCheckpointTampering(t *testing.T) {
	m := soundLedger(t)
	snap := m.Snapshot()
	n := len(snap.Journal)
	_, cp := ledger.AuditWith(snap, ledger.AuditOptions{Cut: int64(n), CutAt: time.Date(2026, 7, 20, 0, 0, 0, 0, time.UTC)})
	if cp == nil {
		t.Fatal("no checkpoint of a sound ledger")
	}
	clone := func() ledger.Checkpoint {
		c := *cp
		c.Accounts = append([]ledger.CheckpointAccount(nil), cp.Accounts...)
		return c
	}
	cases := []struct {
		name   string
		check  string
		modify func(c *ledger.Checkpoint)
	}{
		{"digest changed", ledger.CheckCheckpoint, func(c *ledger.Checkpoint) { c.Digest = "00" + c.Digest[2:] }},
		{"closing vector changed, not resealed", ledger.CheckCheckpoint, func(c *ledger.Checkpoint) { c.Accounts[0].Balances[0].Available++ }},
		{"closing vector forged and resealed", ledger.CheckJournal, func(c *ledger.Checkpoint) {
			c.Accounts[0].Balances[0].Available++
			c.Accounts[0].Balances[0].Opening++
			c.Seal()
		}},
		{"closing vector breaks conservation", ledger.CheckCheckpoint, func(c *ledger.Checkpoint) {
			c.Accounts[0].Balances[0].Opening++
			c.Seal()
		}},
		{"a move summarised that is not", ledger.CheckMove, func(c *ledger.Checkpoint) { c.Moves--; c.Seal() }},
		{"entries do not add up", ledger.CheckCheckpoint, func(c *ledger.Checkpoint) { c.Entries++; c.Seal() }},
		{"first checkpoint names a previous one", ledger.CheckCheckpoint, func(c *ledger.Checkpoint) { c.Prev = "ab"; c.Seal() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := clone()
			tc.modify(&c)
			if found := ledger.Audit(compacted(snap, []ledger.Checkpoint{c}, n)); !hasCheck(found, tc.check) {
				t.Fatalf("found %v, want %s", found, tc.check)
			}
		})
	}
	t.Run("chain out of order", func(t *testing.T) {
		next := clone()
		next.Seq, next.Prev, next.Through = 3, cp.Digest, cp.Through+1
		next.Seal()
		if found := ledger.Audit(compacted(snap, []ledger.Checkpoint{cp.Header(), next}, n)); !hasCheck(found, ledger.CheckCheckpoint) {
			t.Fatalf("found %v", found)
		}
	})
	t.Run("no checkpoint of an unsound ledger", func(t *testing.T) {
		firstAccount(t, m).Balances[0].Available++
		found, c := ledger.AuditWith(m.Snapshot(), ledger.AuditOptions{Cut: int64(n), CutAt: time.Date(2026, 7, 20, 1, 0, 0, 0, time.UTC)})
		if len(found) == 0 || c != nil {
			t.Fatalf("found %v, checkpoint %v", found, c != nil)
		}
	})
}
