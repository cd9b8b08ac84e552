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
	// consistent read and valid only during f. Policies, accounts, moves,
	// shards, statements, retained totals and the checkpoint chain (the
	// last checkpoint with its accounts, the others as headers) are in
	// memory; reservations come through ReservationStream (in id order, a
	// page at a time) and the journal after the last checkpoint through
	// JournalStream, with positions, JournalComplete set. With cut set,
	// through is a journal position a checkpoint of this snapshot may be
	// cut at: every entry up to it is in the snapshot, and no entry
	// committed later will be at or before it (0 when there is none;
	// without cut, always 0). f's error is returned, else the read's.
	AuditSnapshot(ctx context.Context, cut bool, f func(snap *ledger.Snapshot, through int64) error) error

	// CheckpointPut appends c to the chain: c.Seq must be one past the
	// last stored checkpoint's (1 for the first), c.Prev the last's Digest
	// and c.Through beyond the last's, else ErrConflict (another replica
	// cut it first) and nothing changes. The store keeps every header and
	// the accounts of the last two checkpoints.
	CheckpointPut(ctx context.Context, c *ledger.Checkpoint) error

	// JournalCompact deletes up to limit stored journal rows (an entry, or
	// a batch of entries in SQLite) at positions up to the last stored
	// checkpoint's Through, the oldest first, in one short transaction,
	// and returns how many it deleted: 0 once none is left. limit <= 0 is
	// an error.
	JournalCompact(ctx context.Context, limit int) (int, error)
}
