package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// checkpoints holds the checkpoint chain of one rows set, and where the
// journal starts: r.journal[i] is at position journalBase+i+1.
type checkpoints struct {
	chain       []ledger.Checkpoint
	journalBase int64
}

func (r *rows) lastCheckpoint() *ledger.Checkpoint {
	if len(r.cp.chain) == 0 {
		return nil
	}
	return &r.cp.chain[len(r.cp.chain)-1]
}

// CheckpointLast implements store.CheckpointStore.
func (s *Store) CheckpointLast(ctx context.Context) (c ledger.Checkpoint, ok bool, err error) {
	err = s.read(ctx, func(r *rows) error {
		if last := r.lastCheckpoint(); last != nil {
			c, ok = last.Header(), true
		}
		return nil
	})
	return c, ok, err
}

// JournalAfter implements store.CheckpointStore.
func (s *Store) JournalAfter(ctx context.Context, pos int64) (after bool, err error) {
	err = s.read(ctx, func(r *rows) error {
		after = r.cp.journalBase+int64(len(r.journal)) > pos
		return nil
	})
	return after, err
}

// chainCopy copies the chain: headers, the last with its accounts.
func (r *rows) chainCopy() []ledger.Checkpoint {
	out := make([]ledger.Checkpoint, len(r.cp.chain))
	for i := range r.cp.chain {
		out[i] = r.cp.chain[i].Header()
	}
	if n := len(out); n > 0 {
		out[n-1].Accounts = slices.Clone(r.cp.chain[n-1].Accounts)
	}
	return out
}

// journalSince returns copies of the entries after the last checkpoint,
// and the position of the first of them.
func (r *rows) journalSince() ([]ledger.JournalEntry, int64) {
	from := 0
	if last := r.lastCheckpoint(); last != nil {
		from = int(min(max(last.Through-r.cp.journalBase, 0), int64(len(r.journal))))
	}
	return slices.Clone(r.journal[from:]), r.cp.journalBase + int64(from) + 1
}

// AuditSnapshot implements store.CheckpointStore. The memstore holds
// everything in memory anyway; the snapshot is a copy, as Snapshot's.
func (s *Store) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	// One read: the copy and the cut position agree.
	var snap *ledger.Snapshot
	var first, through int64
	err := s.read(ctx, func(r *rows) error {
		snap = r.snapshot()
		_, first = r.journalSince()
		through = r.cp.journalBase + int64(len(r.journal))
		return nil
	})
	if err != nil {
		return err
	}
	journal, reservations := snap.Journal, snap.Reservations
	snap.Journal, snap.Reservations = nil, nil
	// The policies as the SQL stores give them: those asked for.
	policies := make(map[uint64]ledger.Policy, len(snap.Policies))
	for _, p := range snap.Policies {
		policies[p.Generation] = p
	}
	snap.Policies = nil
	snap.PoliciesOf = func(generations []uint64) (map[uint64]ledger.Policy, error) {
		out := make(map[uint64]ledger.Policy, len(generations))
		for _, g := range generations {
			if p, ok := policies[g]; ok {
				out[g] = p
			}
		}
		return out, nil
	}
	// Accounts and the last checkpoint's accounts are streamed in key
	// order, as the SQL stores read them.
	accounts := slices.SortedFunc(slices.Values(snap.Accounts), func(a, b ledger.Account) int { return a.Key.Compare(b.Key) })
	snap.Accounts = nil
	snap.AccountStream = func(yield func(*ledger.Account) error) error {
		for i := range accounts {
			if err := yield(&accounts[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if last := snap.LastCheckpoint(); last != nil {
		cpAccounts := last.Accounts
		last.Accounts = nil
		snap.CheckpointAccountStream = func(yield func(*ledger.CheckpointAccount) error) error {
			for i := range cpAccounts {
				if err := yield(&cpAccounts[i]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
		for i := range journal {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := yield(first+int64(i), &journal[i]); err != nil {
				return err
			}
		}
		return nil
	}
	snap.Estimate = func(withReservations bool) (int64, error) {
		n := int64(len(journal) + len(accounts))
		if withReservations {
			n += int64(len(reservations))
		}
		return n, nil
	}
	snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
		for i := range reservations {
			if err := yield(&reservations[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if !cut {
		through = 0
	}
	return f(snap, through)
}

var errCheckpointArgs = errors.New("memstore: checkpoint")

// CheckpointWrite implements store.CheckpointStore: the writer keeps the
// pages it is given and Finish appends the checkpoint with them at once.
func (s *Store) CheckpointWrite(ctx context.Context, seq int64) (store.CheckpointWriter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !s.checkpointWriting.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("%w %d: another checkpoint is being written: %w", errCheckpointArgs, seq, store.ErrConflict)
	}
	s.mu.RLock()
	last, closed := s.committed.lastCheckpoint(), s.closed
	s.mu.RUnlock()
	var err error
	switch {
	case closed:
		err = errClosed
	case last == nil && seq != 1 || last != nil && seq != last.Seq+1:
		err = fmt.Errorf("%w %d does not follow the last one: %w", errCheckpointArgs, seq, store.ErrConflict)
	}
	if err != nil {
		s.checkpointWriting.Store(false)
		return nil, err
	}
	return &checkpointWriter{s: s, seq: seq}, nil
}

type checkpointWriter struct {
	s        *Store
	seq      int64
	accounts []ledger.CheckpointAccount
	closed   bool
}

// Put implements store.CheckpointWriter.
func (w *checkpointWriter) Put(ctx context.Context, page []ledger.CheckpointAccount) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.accounts = append(w.accounts, page...)
	return nil
}

// Finish implements store.CheckpointWriter.
func (w *checkpointWriter) Finish(ctx context.Context, c *ledger.Checkpoint) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	r := s.committed
	s.beforeApply(false) // durable at once, as the SQL stores' are
	seq, prev, through := int64(1), "", int64(0)
	if last := r.lastCheckpoint(); last != nil {
		seq, prev, through = last.Seq+1, last.Digest, last.Through
	}
	if c.Seq != w.seq || c.Seq != seq || c.Prev != prev || c.Through <= through {
		return fmt.Errorf("%w %d (previous %q, through %d) does not follow %d (%q, through %d): %w",
			errCheckpointArgs, c.Seq, c.Prev, c.Through, seq-1, prev, through, store.ErrConflict)
	}
	cp := c.Header()
	cp.Accounts = slices.Clip(w.accounts)
	if cp.Accounts == nil {
		cp.Accounts = []ledger.CheckpointAccount{}
	}
	w.accounts = nil
	if mutantOn("checkpoint_wrong_closing") && len(cp.Accounts) > 0 {
		// The mutant: a wrong closing vector that still balances (one
		// unit more minted and available), its digests made to agree.
		cp.Accounts[0].Balances[0].Minted++
		cp.Accounts[0].Balances[0].Available++
		cp.Seal()
	}
	r.cp.chain = append(r.cp.chain, cp)
	if n := len(r.cp.chain); n > 2 {
		r.cp.chain[n-3].Accounts = nil
	}
	return nil
}

// Close implements store.CheckpointWriter.
func (w *checkpointWriter) Close() {
	if !w.closed {
		w.closed = true
		w.accounts = nil
		w.s.checkpointWriting.Store(false)
	}
}

// JournalCompact implements store.CheckpointStore.
func (s *Store) JournalCompact(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: compaction limit %d, want a positive one", errCheckpointArgs, limit)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errClosed
	}
	r := s.committed
	s.beforeApply(false) // durable at once, as the SQL stores' are
	last := r.lastCheckpoint()
	if last == nil {
		return 0, nil
	}
	n := int(min(max(last.Through-r.cp.journalBase, 0), int64(limit), int64(len(r.journal))))
	if mutantOn("compaction_drops_entry") && n > 0 && n < limit && n < len(r.journal) {
		n++ // the mutant: the first entry after the checkpoint goes too
	}
	if n == 0 {
		return 0, nil
	}
	r.journal = slices.Clone(r.journal[n:])
	r.cp.journalBase += int64(n)
	return n, nil
}
