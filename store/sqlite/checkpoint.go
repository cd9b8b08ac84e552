package sqlite

import (
	"context"
	"database/sql"
	"sync/atomic"
	"time"
)

// checkpointInterval is how often the checkpointer copies committed WAL
// frames into the database file when something was committed. Once a
// second instead measured no gain over 1,000,000 accounts (the pages a
// pass copies are nearly all distinct there) and no better rollover p99
// (docs/PERFORMANCE.md, a million tenants).
const checkpointInterval = 100 * time.Millisecond

// No connection checkpoints on commit (wal_autocheckpoint(0) on every
// connection): only the checkpointer does. A commit that grows the WAL
// past the autocheckpoint size copies the whole WAL into the database
// file inside the committing batch, holding the one writer, and after a
// long read (an audit's or a checkpoint cut's snapshot of a million
// accounts) kept the WAL from being copied, that is every frame written
// meanwhile: 2.2 s for 200 MB on an idle machine, past the engine's 10 s
// batch timeout under load, so every batch queued behind it failed at
// "begin" (measured for commit d8a9468; docs/PERFORMANCE.md, "The epoch
// rollover and the begin stalls", has what is left). The checkpointer's
// copy, on its own connection, holds neither the writer nor a lock a
// writer or reader waits for.

// checkpointer runs PASSIVE WAL checkpoints on a connection of its own,
// the only checkpoints the store runs (see above). Left to SQLite, the
// commit that grows the WAL past 1000 pages copies them into the database
// file and fsyncs it, a stall during which every caller of that batch,
// and of the batches queued behind it, waits. A checkpoint changes no data, so nothing about durability depends
// on when it runs: each commit's WAL frames are fsynced before it returns.
type checkpointer struct {
	db      *sql.DB
	commits *atomic.Uint64 // Store's commit counter
	// onErr sees every checkpoint error: a failed fsync fails the store
	// (Store.noteFsyncFailure).
	onErr func(error)
	stop  context.CancelFunc
	done  chan struct{}
	// afterCopy, when set (tests), runs between the pass's PASSIVE copy
	// and its restart: where, under load, the committer commits again.
	afterCopy func()
}

func startCheckpointer(db *sql.DB, commits *atomic.Uint64, onErr func(error)) *checkpointer {
	db.SetMaxOpenConns(1)
	ctx, stop := context.WithCancel(context.Background())
	c := &checkpointer{db: db, commits: commits, onErr: onErr, stop: stop, done: make(chan struct{})}
	go c.run(ctx)
	return c
}

func (c *checkpointer) run(ctx context.Context) {
	defer close(c.done)
	ticker := time.NewTicker(checkpointInterval)
	defer ticker.Stop()
	var checkpointed uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if n := c.commits.Load(); n != checkpointed {
			// PASSIVE neither waits for nor blocks the writer or readers;
			// what it cannot copy now (frames newer than the oldest open
			// read) it copies on a later tick. An error (say, a full
			// disk) leaves the WAL to grow, and is tried again on the
			// next tick.
			if err := c.checkpoint(ctx); err != nil {
				c.onErr(err)
				continue
			}
			checkpointed = n
		}
	}
}

// checkpoint copies what it can of the WAL into the database file
// (PASSIVE), then restarts the WAL when it is past walRestartFrames and
// was wholly copied.
func (c *checkpointer) checkpoint(ctx context.Context) error {
	var busy, frames, copied int64
	if err := c.db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied); err != nil {
		return err
	}
	if c.afterCopy != nil {
		c.afterCopy()
	}
	if frames >= walRestartFrames && copied == frames {
		c.restart(ctx)
	}
	return nil
}

// walRestartFrames is the WAL size, in frames (pages), past which the
// checkpointer restarts the WAL once it has copied all of it.
const walRestartFrames = 4096

// restart makes the next write start the WAL from its beginning (and
// journal_size_limit cut the file back). Only a commit's own checkpoint
// (wal_autocheckpoint) did that before, because a writer restarts the WAL
// only when the WAL was wholly copied when its transaction began: with a
// separate checkpointer and commits back to back that moment never
// comes, and the WAL grew by everything written (450-650 MB in 25 s of
// load, scripts/retention-bench.sh). RESTART takes the writer lock for
// the few frames committed since the PASSIVE copy that just finished;
// with no busy wait it neither waits for the committer nor for a reader
// still reading from the WAL, and is tried again on a later tick.
func (c *checkpointer) restart(ctx context.Context) {
	conn, err := c.db.Conn(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		return
	}
	var busy, frames, copied int64
	// SQLITE_BUSY comes back as busy = 1, not as an error.
	if err := conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(RESTART)").Scan(&busy, &frames, &copied); err != nil {
		c.onErr(err)
	}
}

// close stops the checkpointer and closes its connection.
func (c *checkpointer) close() error {
	c.stop()
	<-c.done
	return c.db.Close()
}
