package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Pipelined durability. Over a pipelined store (store.Syncer, e.g. SQLite
// opened with sqlite.WithPipelinedSync) a batch is committed without
// waiting for its fsync (Core.CommitDeferred) and its callers are answered
// only once a Sync that began after that commit has returned: the
// committer goes on to apply and write the next batch while the syncer
// goroutine waits for the disk. One fsync covers every batch committed
// before it began, so batches that queue up behind a slow fsync share the
// next one. A caller that ran its batch itself on an idle engine (DoBatch)
// syncs on its own goroutine instead, after letting the next batch start.
//
// fsyncgate: after a failed Sync the engine fails for good. Linux may drop
// the dirty pages a failed fsync was to write and report the next fsync as
// a success, so a retry would acknowledge data that is gone. Every command
// then fails with the error, Ready reports it (so /readyz does), and the
// store refuses its reads too; a restart recovers from what is on disk.
type pipeline struct {
	core *Core
	log  *slog.Logger
	// started numbers the batches (bumped before each commit); committed
	// is the number of the last batch whose commit returned; durable the
	// number up to which a sync has succeeded. One batch runs at a time,
	// so each only grows.
	started, committed, durable atomic.Uint64

	syncMu sync.Mutex // one Sync at a time
	mu     sync.Mutex // guards changed
	// changed is closed (and replaced) when durable advances or the
	// pipeline fails.
	changed chan struct{}
	failed  atomic.Pointer[errBox]

	// queue carries the committer's batches to the syncer goroutine,
	// which answers them once durable; done closes when it has stopped.
	queue chan *syncWait
	done  chan struct{}
}

// syncWait is a committed batch waiting for its fsync.
type syncWait struct {
	batch []*request
	out   outcome
}

// syncQueue bounds how many committed batches may wait for an fsync
// before the committer waits too.
const syncQueue = 16

func newPipeline(core *Core, log *slog.Logger) *pipeline {
	p := &pipeline{core: core, log: log, changed: make(chan struct{}), queue: make(chan *syncWait, syncQueue), done: make(chan struct{})}
	go p.run()
	return p
}

// run is the syncer goroutine: it answers the committer's batches in
// order, each once durable (the first one's sync usually covers the
// others), until the queue is closed.
func (p *pipeline) run() {
	defer close(p.done)
	for w := range p.queue {
		if err := p.await(w.out.seq); err != nil {
			w.out = outcome{err: err}
		}
		answer(w.batch, w.out)
	}
}

// failure returns the permanent error after a failed sync, or nil.
func (p *pipeline) failure() error {
	if b := p.failed.Load(); b != nil {
		return b.err
	}
	return nil
}

// await returns nil once batch seq is durable, syncing if nobody else
// is, or the permanent error.
func (p *pipeline) await(seq uint64) error {
	for {
		p.mu.Lock()
		changed := p.changed
		p.mu.Unlock()
		if err := p.failure(); err != nil {
			return err
		}
		if p.durable.Load() >= seq {
			return nil
		}
		if p.committed.Load() >= seq {
			p.sync()
			continue
		}
		<-changed
	}
}

// sync makes every batch committed so far durable, unless a sync that
// covered them has just done so.
func (p *pipeline) sync() {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	if p.failure() != nil {
		return
	}
	target := p.committed.Load()
	if p.durable.Load() >= target {
		return
	}
	if err := p.core.Sync(context.Background()); err != nil {
		err = fmt.Errorf("%w: the store's fsync failed; every command is refused until the server restarts, "+
			"and the batches not yet answered may or may not be on disk: %w", store.ErrUnavailable, err)
		p.failed.CompareAndSwap(nil, &errBox{err: err})
		p.log.Error("fsync failed: refusing every command until restart", "err", err)
	} else {
		p.durable.Store(target)
	}
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// outcome is what committing one batch gave: the results (or the error)
// and, pipelined, the batch's number for the fsync to wait for.
type outcome struct {
	results []ledger.Result
	err     error
	seq     uint64
}

// answer gives every request of batch its share of out and wakes it.
func answer(batch []*request, out outcome) {
	offset := 0
	for _, req := range batch {
		if out.err != nil {
			req.err = out.err
		} else {
			req.results = out.results[offset : offset+len(req.cmds) : offset+len(req.cmds)]
		}
		offset += len(req.cmds)
		close(req.done)
	}
}

// settle answers a batch the caller committed itself: pipelined, once it
// is durable.
func (e *Engine) settle(batch []*request, out outcome) {
	if e.pipe != nil && out.err == nil && len(batch) > 0 {
		if err := e.pipe.await(out.seq); err != nil {
			out = outcome{err: err}
		}
	}
	answer(batch, out)
}

// failure returns the permanent error of a failed fsync, or nil.
func (e *Engine) failure() error {
	if e.pipe == nil {
		return nil
	}
	return e.pipe.failure()
}

// Pipelined reports whether the engine answers batches after an fsync of
// its own (pipelined durability) rather than inside each commit.
func (e *Engine) Pipelined() bool { return e.pipe != nil }
