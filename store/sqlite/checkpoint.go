package sqlite

import (
	"context"
	"database/sql"
	"sync/atomic"
	"time"
)

// checkpointInterval is how often the checkpointer copies committed WAL
// frames into the database file when something was committed.
const checkpointInterval = 100 * time.Millisecond

// autocheckpointBackstop is the WAL size, in pages, at which a commit runs
// a checkpoint itself (SQLite's default is 1000): only when the
// checkpointer falls that far behind.
const autocheckpointBackstop = 8000

// checkpointer runs PASSIVE WAL checkpoints on a connection of its own.
// Left to SQLite, the commit that grows the WAL past 1000 pages copies them
// into the database file and fsyncs it, a stall of milliseconds during
// which every caller of that batch, and of the batches queued behind it,
// waits. A checkpoint changes no data, so nothing about durability depends
// on when it runs: each commit's WAL frames are fsynced before it returns.
type checkpointer struct {
	db      *sql.DB
	commits *atomic.Uint64 // Store's commit counter
	// onErr sees every checkpoint error: a failed fsync fails the store
	// (Store.noteFsyncFailure).
	onErr func(error)
	stop  context.CancelFunc
	done  chan struct{}
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
			// what it cannot copy now it copies on a later tick. An error
			// (say, a full disk) leaves the WAL to grow until the writer's
			// backstop checkpoint, which reports it to a caller.
			if _, err := c.db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err == nil {
				checkpointed = n
			} else {
				c.onErr(err)
			}
		}
	}
}

// close stops the checkpointer and closes its connection.
func (c *checkpointer) close() error {
	c.stop()
	<-c.done
	return c.db.Close()
}
