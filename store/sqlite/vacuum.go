package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// Space: what retention frees comes back.
//
// SQLite reuses the pages of deleted rows for new ones (its freelist), so
// under steady retention the file stops growing. With auto_vacuum =
// INCREMENTAL it can also give them back to the filesystem: Reclaim moves
// up to reclaimPages free pages to the end of the file and truncates it,
// in a write transaction of its own, bounded like any batch. A new file
// is created INCREMENTAL; a file created before (auto_vacuum NONE) keeps
// working as before and is converted by ConvertAutoVacuum (capledger
// migrate --auto-vacuum), which rewrites it once with VACUUM.
//
// journal_size_limit bounds the WAL file left behind after a checkpoint
// (walSizeLimit): it otherwise keeps its largest size forever.

// Auto-vacuum modes of PRAGMA auto_vacuum.
const (
	AutoVacuumNone        = 0
	AutoVacuumFull        = 1
	AutoVacuumIncremental = 2
)

// reclaimPages bounds one step of Reclaim: 1024 pages of 4 KiB, 4 MiB.
const reclaimPages = 1024

// walSizeLimit is journal_size_limit: the WAL is truncated to it when a
// checkpoint resets it.
const walSizeLimit = 64 << 20

// A new file gets INCREMENTAL from setup, which sets it before
// journal_mode(WAL) writes the file's first page (not from the DSN: see
// fileFormatPragmas). An existing file of another mode keeps it (only a
// VACUUM outside WAL mode changes it: convertAutoVacuum).

// AutoVacuum returns the file's PRAGMA auto_vacuum mode.
func (s *Store) AutoVacuum(ctx context.Context) (int, error) {
	if s.closed.Load() {
		return 0, errClosed
	}
	var mode int
	if err := s.readDB.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&mode); err != nil {
		return 0, fmt.Errorf("auto_vacuum: %w", translate(ctx, err))
	}
	return mode, nil
}

// FreePages returns the pages on the file's freelist (PRAGMA
// freelist_count) and its size in pages (page_count).
func (s *Store) FreePages(ctx context.Context) (free, total int64, err error) {
	if s.closed.Load() {
		return 0, 0, errClosed
	}
	if err := s.readDB.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&free); err != nil {
		return 0, 0, fmt.Errorf("freelist_count: %w", translate(ctx, err))
	}
	if err := s.readDB.QueryRowContext(ctx, "PRAGMA page_count").Scan(&total); err != nil {
		return 0, 0, fmt.Errorf("page_count: %w", translate(ctx, err))
	}
	return free, total, nil
}

// withWriter runs f on the write connection while no transaction is open
// (waiting for the writer like Begin does) and, in a pipelined store,
// makes what f committed durable before it returns, as Tx.Commit does.
func (s *Store) withWriter(ctx context.Context, f func(w *writer) error) error {
	if s.closed.Load() {
		return errClosed
	}
	select {
	case s.writer <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.writer }()
	if s.closed.Load() {
		return errClosed
	}
	if err := s.sync.failure(); err != nil {
		return err
	}
	// Pipelined, what f commits is durable once the Sync returns: f
	// counts each of its commits (beginWrite, endWrite; inWriteTx does)
	// as Tx.commit does, so reads wait for this Sync, and only once
	// something is committed.
	err := f(s.w)
	s.noteFsyncFailure(err)
	if err != nil {
		return err
	}
	return s.Sync(ctx)
}

// Reclaim gives all of the file's free pages back to the filesystem
// (PRAGMA incremental_vacuum) when the file is INCREMENTAL, in steps of
// reclaimPages, each a write transaction of its own that waits for the
// writer like a batch does, so batches run between steps; otherwise it
// does nothing (later writes reuse the freelist). It returns when the
// freelist is empty or ctx ends. Operators' tools call it; the engine's
// workers call ReclaimStep, which keeps a reserve for reuse.
func (s *Store) Reclaim(ctx context.Context) error {
	mode, err := s.AutoVacuum(ctx)
	if err != nil || mode != AutoVacuumIncremental {
		return err
	}
	for ctx.Err() == nil {
		free, _, err := s.FreePages(ctx)
		if err != nil || free == 0 {
			return err
		}
		if err := s.vacuumStep(ctx, reclaimPages); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// reclaimReserve is the share of the file's pages ReclaimStep leaves on
// the freelist: under steady retention the pages freed by one pass are
// the pages the next rows need, and returning them only to grow the file
// again would cost a write of every moved page and its WAL frame.
const reclaimReserve = 8 // one eighth

// ReclaimStep implements engine.Reclaimer: one incremental_vacuum of up
// to pages pages, leaving a reserve of an eighth of the file's pages on
// the freelist, when the file is INCREMENTAL (otherwise it does nothing).
// It reports whether more than the reserve is still free.
func (s *Store) ReclaimStep(ctx context.Context, pages int) (bool, error) {
	if pages <= 0 {
		return false, fmt.Errorf("reclaim: %d pages, want a positive number", pages)
	}
	mode, err := s.AutoVacuum(ctx)
	if err != nil || mode != AutoVacuumIncremental {
		return false, err
	}
	free, total, err := s.FreePages(ctx)
	if err != nil {
		return false, err
	}
	keep := total / reclaimReserve
	if free <= keep {
		return false, nil
	}
	n := min(int64(pages), free-keep)
	if err := s.vacuumStep(ctx, n); err != nil {
		return false, err
	}
	return free-n > keep, nil
}

// vacuumStep runs PRAGMA incremental_vacuum(pages) on the writer.
func (s *Store) vacuumStep(ctx context.Context, pages int64) error {
	return s.withWriter(ctx, func(w *writer) error {
		st, err := w.stmt(stmtCtx(ctx), fmt.Sprintf("PRAGMA incremental_vacuum(%d)", pages))
		if err != nil {
			return fmt.Errorf("reclaim: %w", translate(ctx, err))
		}
		// incremental_vacuum answers a row per page freed: read them.
		// It commits on its own (no transaction is open): counted like a
		// COMMIT.
		seq := s.beginWrite()
		err = w.query(stmtCtx(ctx), st, nil, func(scanner) error { return nil })
		s.endWrite(seq)
		if err != nil {
			return fmt.Errorf("reclaim: %w", translate(ctx, err))
		}
		s.commits.Add(1) // the checkpointer copies the truncation
		return nil
	})
}

// WithAutoVacuumConversion makes Open convert a file created with
// auto_vacuum NONE to INCREMENTAL before anything else uses it: it leaves
// WAL mode, sets the mode, rewrites the file with VACUUM (which needs free
// disk space of about the file's size and takes seconds per GiB) and goes
// back to WAL. Open then fails if another process has the file open.
// capledger migrate --auto-vacuum opens with it; a file that is
// INCREMENTAL already is left alone.
func WithAutoVacuumConversion() Option { return func(c *config) { c.convertAutoVacuum = true } }

// convertAutoVacuum is WithAutoVacuumConversion's step of setup.
func convertAutoVacuum(ctx context.Context, db *sql.DB) error {
	var mode int
	if err := db.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&mode); err != nil {
		return translate(ctx, err)
	}
	if mode == AutoVacuumIncremental {
		return nil
	}
	// auto_vacuum cannot change from NONE on a WAL database, even by VACUUM.
	for _, q := range []string{"PRAGMA journal_mode = DELETE", fmt.Sprintf("PRAGMA auto_vacuum = %d", AutoVacuumIncremental),
		"VACUUM", "PRAGMA journal_mode = WAL"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("convert auto_vacuum: %s: %w", q, translate(ctx, err))
		}
	}
	return nil
}
