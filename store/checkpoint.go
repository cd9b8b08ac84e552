package store

import (
	"context"

	"github.com/capledger/capledger/ledger"
)

// CheckpointStore keeps the checkpoint chain (ledger.Checkpoint) and
// deletes the journal it summarises. The ledger cuts and verifies
// checkpoints (ledger.AuditWith, ledger.VerifyCheckpoints); a store only
// keeps them, and never deletes a journal entry the last stored checkpoint
// does not summarise.
type CheckpointStore interface {
	// AuditSnapshot calls f with a snapshot for an audit, read in one
	// consistent read and valid only during f. Moves, shards,
	// statements, retained totals and the checkpoint chain's headers are
	// in memory; the policies may come through PoliciesOf instead (those
	// of the generations asked: an audit asks for a page of accounts'
	// at a time, so a policy per tenant is not held whole); the accounts come through AccountStream and the last
	// checkpoint's accounts through CheckpointAccountStream (each in key
	// order, a page at a time, as often as the audit calls them),
	// reservations through ReservationStream (in id order, a page at a
	// time) and the journal after the last checkpoint through
	// JournalStream, with positions, JournalComplete set. With cut set,
	// through is a journal position a checkpoint of this snapshot may be
	// cut at: every entry up to it is in the snapshot, and no entry
	// committed later will be at or before it (0 when there is none;
	// without cut, always 0). f's error is returned, else the read's.
	AuditSnapshot(ctx context.Context, cut bool, f func(snap *ledger.Snapshot, through int64) error) error

	// CheckpointLast returns the header of the last stored checkpoint
	// (no accounts), and false when none is stored: one indexed row, read
	// by the compaction worker at every pass to know when it last cut,
	// including across restarts and leader changes.
	CheckpointLast(ctx context.Context) (ledger.Checkpoint, bool, error)

	// JournalAfter reports whether a journal entry at a position after
	// pos is committed: one indexed probe, the compaction worker's
	// watermark. Before a cut it asks about the last checkpoint's
	// Through, and with nothing after it takes no audit snapshot (which
	// reads every move, shard, statement and retained total, and the
	// policies of every account).
	JournalAfter(ctx context.Context, pos int64) (bool, error)

	// CheckpointWrite starts writing checkpoint seq, which must be one
	// past the last stored checkpoint's (1 for the first), else
	// ErrConflict; ErrConflict too while another writer (another replica)
	// is writing one. It first deletes the account rows an attempt that
	// never stored its header left, in bounded transactions. The writer
	// stores the accounts a page per transaction and the header last, so
	// a checkpoint is invisible until whole; the caller paces the pages.
	// The store keeps every header and the accounts of the last two
	// checkpoints.
	CheckpointWrite(ctx context.Context, seq int64) (CheckpointWriter, error)

	// JournalCompact deletes up to limit stored journal rows (an entry, or
	// a batch of entries in SQLite) at positions up to the last stored
	// checkpoint's Through, the oldest first, in one short transaction,
	// and returns how many it deleted: 0 once none is left. limit <= 0 is
	// an error.
	JournalCompact(ctx context.Context, limit int) (int, error)
}

// CheckpointWriter writes one checkpoint (CheckpointStore.CheckpointWrite).
type CheckpointWriter interface {
	// Put stores page, the checkpoint's next accounts in key order, in
	// bounded transactions (one per page of the driver's size); they stay
	// invisible until Finish. A writer that lost its right to write to
	// another (PostgreSQL: its lease lapsed and was taken over) gets
	// ErrConflict from Put and Finish, and writes nothing more.
	Put(ctx context.Context, page []ledger.CheckpointAccount) error
	// Finish stores c's header (c.Seq the writer's, c.Accounts ignored: they
	// are the pages put) in one short transaction that checks c still
	// follows the chain: c.Prev the last's Digest and c.Through beyond
	// the last's, else ErrConflict and nothing becomes visible. Then it
	// deletes the accounts older checkpoints no longer need, a page at a
	// time (what it leaves, the next checkpoint's write deletes).
	Finish(ctx context.Context, c *ledger.Checkpoint) error
	// Close ends the writer (after Finish or instead of it): rows put
	// without a Finish stay invisible, and the next CheckpointWrite
	// deletes them.
	Close()
}

// CheckpointPage is how many accounts PutCheckpoint hands a writer at a
// time.
const CheckpointPage = 1024

// PutCheckpoint stores c, accounts and all, through s's CheckpointWrite:
// pages of CheckpointPage accounts, the header last. The engine writes
// the checkpoints it cuts the same way, a page as the audit makes it.
func PutCheckpoint(ctx context.Context, s CheckpointStore, c *ledger.Checkpoint) error {
	w, err := s.CheckpointWrite(ctx, c.Seq)
	if err != nil {
		return err
	}
	defer w.Close()
	for start := 0; start < len(c.Accounts); start += CheckpointPage {
		if err := w.Put(ctx, c.Accounts[start:min(start+CheckpointPage, len(c.Accounts))]); err != nil {
			return err
		}
	}
	return w.Finish(ctx, c)
}
