package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/sqlite"
)

// crash variants of the ledger process.
const (
	crashNone        = iota
	crashBeforeBatch // dies with requests accepted but not yet committed
	crashInCommit    // dies inside the store commit (memstore.Crash on the open transaction)
	crashAfterCommit // dies after the commit, before answering anyone
)

// commitFault is what the store does to the next commit of a batch.
type commitFault uint8

const (
	faultNone commitFault = iota
	faultFail
	faultConflict
	faultLoseAck
	faultCrash
)

// recStore is the store the engine runs on: the memstore (or a test's
// wrapper around it). It arms the batch's fault on the memstore right
// before the commit it is meant for (so a fault never lingers onto a later
// batch), and hands the checker every change set that became durable,
// including the ones whose acknowledgement was lost.
type recStore struct {
	store.Store
	// mem is the memstore below, or nil when the interleaving runs on
	// SQLite; then the recording store injects the commit faults itself.
	mem       *memstore.Store
	fault     commitFault
	committed []*store.Changes
	// unsynced are the change sets of deferred commits (pipelined
	// durability) not yet made durable by a Sync: they move to committed
	// when a Sync (or a crash that keeps them) makes them durable, and
	// vanish with a crash that loses them.
	unsynced []*store.Changes
	commits  int // Commit calls in the current batch
	// afterDue, when set, runs once after the next ReservationsDue: the
	// simulation uses it to commit a batch between engine.Core.Due's
	// listing of due reservations (which Due turns into commands without
	// reading the rows again) and the worker's batch.
	afterDue func()
}

func (s *recStore) ReservationsDue(ctx context.Context, now time.Time, limit int) ([]store.DueReservation, error) {
	due, err := s.Store.ReservationsDue(ctx, now, limit)
	if f := s.afterDue; f != nil {
		s.afterDue = nil
		f()
	}
	return due, err
}

// Pipelined and Sync make the recording store a store.Syncer when the
// store below is one.
func (s *recStore) Pipelined() bool {
	inner, ok := s.Store.(store.Syncer)
	return ok && inner.Pipelined()
}

func (s *recStore) Sync(ctx context.Context) error {
	if inner, ok := s.Store.(store.Syncer); ok {
		return inner.Sync(ctx)
	}
	return nil
}

// synced moves the unsynced change sets to the durable ones.
func (s *recStore) synced() {
	s.committed = append(s.committed, s.unsynced...)
	s.unsynced = nil
}

// StatementsRemove and JournalCompact are durable at once on the
// memstore, which first makes every deferred commit before them durable
// (its beforeApply): the record follows, so a crash after them keeps
// those commits in the checker's view as it does in the store. (SQLite's
// write transactions outside a Tx are not synced themselves; its WAL
// keeps them in order after the commits before them, and a SQLite crash
// here keeps every commit.)
func (s *recStore) StatementsRemove(ctx context.Context, before time.Time, limit int) (int, error) {
	n, err := s.Store.StatementsRemove(ctx, before, limit)
	s.removedDurably(err)
	return n, err
}

func (s *recStore) JournalCompact(ctx context.Context, limit int) (int, error) {
	n, err := s.Store.JournalCompact(ctx, limit)
	s.removedDurably(err)
	return n, err
}

// removedDurably records a removal outside transactions with outcome err
// (see StatementsRemove).
func (s *recStore) removedDurably(err error) {
	if err == nil && s.mem != nil {
		s.synced()
	}
}

func (s *recStore) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &recTx{Tx: tx, s: s}, nil
}

type recTx struct {
	store.Tx
	s       *recStore
	changes *store.Changes
}

func (t *recTx) Write(ctx context.Context, c *store.Changes) error {
	if err := t.Tx.Write(ctx, c); err != nil {
		return err
	}
	t.changes = c
	return nil
}

func (t *recTx) Commit(ctx context.Context) error { return t.commit(ctx, false) }

// CommitDeferred commits without the fsync when the store below is
// pipelined; the changes then wait in unsynced for a Sync.
func (t *recTx) CommitDeferred(ctx context.Context) error { return t.commit(ctx, true) }

func (t *recTx) commit(ctx context.Context, deferred bool) error {
	s := t.s
	s.commits++
	fault := s.fault
	s.fault = faultNone
	inner, ok := t.Tx.(store.DeferredCommitter)
	deferred = deferred && ok && s.Pipelined()
	commitInner := t.Tx.Commit
	if deferred {
		commitInner = inner.CommitDeferred
	}
	// applied records a commit the store applied. A Commit (not
	// deferred) is durable when it returns together with every deferred
	// commit before it (the memstore's beforeApply; SQLite's Commit syncs
	// the WAL), so those become durable first, in commit order, also when
	// it wrote nothing: a removal decided on them (the shard removal's
	// transactions) must never be durable without them.
	applied := func() {
		if !deferred {
			s.synced()
		}
		if t.changes == nil {
			return
		}
		if deferred {
			s.unsynced = append(s.unsynced, t.changes)
		} else {
			s.committed = append(s.committed, t.changes)
		}
	}
	if s.mem == nil {
		return t.commitSQLite(ctx, fault, commitInner, applied)
	}
	switch fault {
	case faultFail:
		s.mem.FailNextCommit(fmt.Errorf("%w: injected commit failure", store.ErrUnavailable))
	case faultConflict:
		s.mem.FailNextCommit(fmt.Errorf("%w: injected", store.ErrConflict))
	case faultLoseAck:
		s.mem.LoseNextCommitAck()
	case faultCrash:
		s.mem.Crash()
	}
	err := commitInner(ctx)
	if err == nil || fault == faultLoseAck {
		applied()
	}
	return err
}

// commitSQLite is Commit over the SQLite store, whose faults the
// recording store injects around the real commit: a failure or a
// conflict (and a crash inside the commit) rolls back and applies
// nothing; a lost acknowledgement commits and reports failure.
func (t *recTx) commitSQLite(ctx context.Context, fault commitFault, commitInner func(context.Context) error, applied func()) error {
	switch fault {
	case faultFail, faultConflict, faultCrash:
		t.Tx.Rollback(ctx)
		if fault == faultConflict {
			return fmt.Errorf("%w: injected", store.ErrConflict)
		}
		return fmt.Errorf("%w: injected commit failure", store.ErrUnavailable)
	}
	err := commitInner(ctx)
	if err == nil {
		applied()
	}
	if err == nil && fault == faultLoseAck {
		return fmt.Errorf("%w: acknowledgement lost", store.ErrUnavailable)
	}
	return err
}

// ledgerNode is the central ledger process: the real engine.Core over a
// memstore, fed batches of commands (group commit), with its background
// workers. It can crash and restart; the store keeps what was committed.
type ledgerNode struct {
	mem *memstore.Store
	// sqlitePath is the database file when the interleaving runs on the
	// real SQLite store (in a temporary directory), "" on the memstore.
	sqlitePath  string
	sqliteDir   string
	sqlite      *sqlite.Store
	st          *recStore
	core        *engine.Core
	up          bool
	incarnation int32
	inbox       []*message
	internal    []internalCmd
	pending     bool // a batch event is scheduled
	dying       int  // crash variant armed for the next batch
	commits     int64
	lastEpochs  int64
	// lastRetention is when the retention worker last ran.
	lastRetention int64
	answers       int64
	// lateDrains are duplicate recoveries held back for a later batch.
	lateDrains []internalCmd
	// Pipelined durability: awaiting holds the committed batches whose
	// answers wait for an fsync, oldest first; syncing is set while one
	// is in flight, which covers the first syncCovers of them.
	awaiting   []*batchAnswers
	syncing    bool
	syncCovers int
	// lostUnsynced counts the commits crashes lost before their fsync.
	lostUnsynced int
}

// batchAnswers is a committed batch's answers, held until it is durable.
type batchAnswers struct {
	inbox    []*message
	internal []internalCmd
	owners   []int
	results  []ledger.Result
}

// internalCmd is a command from inside the ledger process: a worker or an
// operator's admin call. They skip the network.
type internalCmd struct {
	cmd     ledger.Command
	from    internalOrigin
	debtPay bool // repays debt (refill or drain of an indebted account)
}

type internalOrigin uint8

const (
	fromWorker internalOrigin = iota + 1
	fromOperator
)

// newLedger opens the ledger process over a fresh memstore. A test's store
// wrapper goes between the recording store and the memstore, so the
// checker sees what the engine wrote, not what a broken store kept.
func (w *world) newLedger() {
	if w.onSQLite {
		w.newSQLiteLedger()
		return
	}
	mem := memstore.New()
	mem.SetPipelined(w.pipelined)
	var inner store.Store = mem
	if w.hooks.wrapStore != nil {
		inner = w.hooks.wrapStore(mem)
	}
	st := &recStore{Store: inner, mem: mem}
	w.ledger = ledgerNode{mem: mem, st: st, core: engine.NewCore(st), up: true}
	w.ledgerStore = st
}

// newSQLiteLedger opens the ledger process over the real SQLite store, in
// a fresh temporary directory (on /dev/shm where there is one: the
// store's fsyncs then cost nothing, and the file is still closed and
// reopened on every ledger crash).
func (w *world) newSQLiteLedger() {
	dir, err := os.MkdirTemp(sqliteTempRoot(), "capledger-sim-")
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("sqlite temp dir: %v", err))
		w.fail.Detail += " (the SQLite store mode needs a writable temp dir)"
		return
	}
	path := filepath.Join(dir, "ledger.db")
	st := &recStore{}
	w.ledger = ledgerNode{st: st, up: true, sqlitePath: path, sqliteDir: dir}
	w.ledgerStore = st
	w.openSQLite()
}

// openSQLite (re)opens the database file as the ledger process's store.
func (w *world) openSQLite() {
	n := &w.ledger
	var opts []sqlite.Option
	if w.pipelined {
		opts = append(opts, sqlite.WithPipelinedSync())
	}
	db, err := sqlite.Open(w.ctx, n.sqlitePath, opts...)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("open sqlite %s: %v", n.sqlitePath, err))
		return
	}
	var inner store.Store = db
	if w.hooks.wrapStore != nil {
		inner = w.hooks.wrapStore(db)
	}
	n.st.Store = inner
	n.sqlite = db
	n.core = engine.NewCore(n.st)
}

// closeLedgerStore closes the SQLite store and removes its directory at
// the end of an interleaving.
func (w *world) closeLedgerStore() {
	n := &w.ledger
	if n.sqliteDir == "" {
		return
	}
	if n.sqlite != nil {
		n.sqlite.Close()
		n.sqlite = nil
	}
	os.RemoveAll(n.sqliteDir)
}

func sqliteTempRoot() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}

func (w *world) ledgerReceive(m *message) {
	n := &w.ledger
	if !n.up {
		w.log(recDownDrop, ledgerNodeID, m.cmd.Kind, m.cmd.ReservationID, 0, "ledger down")
		return
	}
	w.log(recDeliver, ledgerNodeID, m.cmd.Kind, m.cmd.ReservationID, int64(m.from), msgNames[m.kind])
	if !m.late {
		w.shardDelivered(m)
	}
	n.inbox = append(n.inbox, m)
	w.scheduleBatch()
	if m.kind == msgCommand && m.cmd.Kind == ledger.KindStart && !m.probe {
		// A start that lands just before its hold runs out: the expiry
		// worker may list the hold while the start's batch is in flight.
		r := w.requests[m.owner]
		if left := r.expiresAt - w.now; left > 0 && left <= raceSkew && w.f.fire(SiteWorkerRereadRace) {
			w.schedule(event{at: w.now, kind: evRaceWorker, a: r.idx, b: n.incarnation})
		}
	}
}

// raceSkew is how far ahead of a batch's clock the expiry worker's clock
// may be in the worker_reread_race site: the batch took its time before
// the worker took its own, and commits after the worker listed.
const raceSkew = int64(10 * time.Millisecond)

// raceWorker runs the real expiry worker code, engine.Core.Due, at the
// hold's expiry (a clock at most raceSkew ahead of the ledger's batch
// clock), and commits the ledger's pending batch, which holds the start,
// right after Due's listing of the due holds, from which Due makes its
// commands: the interleaving of a worker goroutine and a gateway's batch
// in the real server. The worker's commands, made from the stale listing,
// then run in the next batch, as any worker's do.
func (w *world) raceWorker(idx, incarnation int32) {
	n := &w.ledger
	r := w.requests[idx]
	if !n.up || n.incarnation != incarnation || len(n.inbox) == 0 {
		return
	}
	listAt := epoch0.Add(time.Duration(max(r.expiresAt, w.now)))
	n.st.afterDue = func() {
		w.log(recWorker, ledgerNodeID, ledger.KindStart, r.id, int64(len(n.inbox)), "batch commits between Due's listing and the worker's batch")
		w.ledgerBatch()
	}
	due, err := n.core.Due(w.ctx, listAt, 64)
	n.st.afterDue = nil
	if w.fail != nil {
		return
	}
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("engine.Core.Due: %v", err))
		return
	}
	if !n.up || n.incarnation != incarnation {
		return // the nested batch crashed the process: the worker died with it
	}
	for _, c := range due {
		n.internal = append(n.internal, internalCmd{cmd: c, from: fromWorker})
	}
	if len(n.internal) > 0 {
		w.log(recWorker, ledgerNodeID, 0, "", int64(len(n.internal)), "")
		w.scheduleBatch()
	}
}

func (w *world) scheduleBatch() {
	n := &w.ledger
	if !n.pending {
		n.pending = true
		w.after(batchWindow, evBatch, n.incarnation, 0, 0)
	}
}

// ledgerBatch commits everything the ledger process has gathered as one
// store transaction through engine.Core.Commit, then answers.
func (w *world) ledgerBatch() {
	n := &w.ledger
	n.pending = false
	if !n.up {
		return
	}
	if n.dying == crashBeforeBatch {
		w.crashLedger("before committing its batch")
		return
	}
	inbox := n.inbox
	n.inbox = nil
	internal := n.internal
	n.internal = nil

	// Actor commands and internal ones interleave in either order, so a
	// start and an expiry claim that meet in one batch race both ways.
	var cmds []ledger.Command
	var owners []int // index into inbox, or -1-i for internal[i]
	internalFirst := w.chance(0.5)
	addInternal := func() {
		for i := range internal {
			cmds = append(cmds, internal[i].cmd)
			owners = append(owners, -1-i)
		}
	}
	if internalFirst {
		addInternal()
	}
	refunds, debtPay, records := false, false, false
	for i, m := range inbox {
		if m.kind == msgCommand {
			cmds = append(cmds, m.cmd)
			owners = append(owners, i)
			refunds = refunds || m.cmd.Kind == ledger.KindSettle || m.cmd.Kind == ledger.KindRelease
			records = records || m.cmd.Kind == ledger.KindRecord
			// A reserve or settle on an indebted account repays debt
			// through the refill it runs first.
			debtPay = debtPay || w.chk.commandOnDebt(&m.cmd)
		}
	}
	if !internalFirst {
		addInternal()
	}
	for i := range internal {
		debtPay = debtPay || internal[i].debtPay
	}

	var results []ledger.Result
	var err error
	if len(cmds) > 0 {
		fault := faultNone
		switch {
		case n.dying == crashInCommit:
			fault = faultCrash
		case w.f.fire(SiteCommitFail):
			fault = faultFail
		case w.f.fire(SiteCommitConflict):
			fault = faultConflict
		case w.f.fire(SiteCommitAckLost),
			refunds && w.f.fire(SiteLostRefundAck),
			debtPay && w.f.fire(SiteLostDebtRepaymentAck),
			records && w.f.fire(SiteLostRecordAck):
			fault = faultLoseAck
		}
		results, err = w.commit(cmds, fault)
		if w.fail != nil {
			return
		}
		if fault == faultCrash {
			w.crashLedger("inside the store commit")
			return
		}
	}
	if n.dying == crashAfterCommit {
		w.crashLedger("after committing, before answering")
		return
	}
	if err != nil {
		w.log(recCommitFailed, ledgerNodeID, 0, "", int64(len(cmds)), err.Error())
	}
	if w.pipelined && err == nil && !w.hooks.answerBeforeSync {
		// Committed without its fsync: answered (lookups read) once a
		// simulated fsync that began after the commit returns.
		n.awaiting = append(n.awaiting, &batchAnswers{inbox: inbox, internal: internal, owners: owners, results: results})
		w.startSync()
		return
	}
	w.ledgerAnswer(inbox, internal, owners, results, err)
	// A commit whose acknowledgement was lost is in the store all the
	// same, waiting for an fsync like any other.
	w.startSync()
}

// ledgerAnswer sends a batch's answers (or its failure) and answers its
// lookups from committed state.
func (w *world) ledgerAnswer(inbox []*message, internal []internalCmd, owners []int, results []ledger.Result, err error) {
	n := &w.ledger
	for k, owner := range owners {
		if owner < 0 {
			ic := &internal[-1-owner]
			if err == nil {
				w.internalAnswer(ic, &results[k])
			} else {
				w.internalFailed(ic)
			}
			continue
		}
		m := inbox[owner]
		n.answers++
		answer := &message{from: ledgerNodeID, to: m.from, owner: m.owner, attempt: m.attempt, probe: m.probe, late: m.late, cmd: m.cmd, answerID: n.answers, sub: m.sub}
		if err != nil {
			answer.kind = msgUnavailable
		} else {
			answer.kind = msgAnswer
			answer.res = &results[k]
			if (m.cmd.Kind == ledger.KindSettle || m.cmd.Kind == ledger.KindRelease) && w.f.fire(SiteLostRefundAck) {
				w.log(recAckLost, ledgerNodeID, m.cmd.Kind, m.cmd.ReservationID, 0, "refund answer lost")
				continue
			}
			if m.cmd.Kind == ledger.KindRecord && w.f.fire(SiteLostRecordAck) {
				w.log(recAckLost, ledgerNodeID, m.cmd.Kind, m.cmd.ReservationID, 0, "record answer lost")
				continue
			}
		}
		w.send(answer)
	}
	// Lookups read committed state, after this batch.
	for _, m := range inbox {
		if m.kind != msgLookup {
			continue
		}
		answer := &message{kind: msgLookupAnswer, from: ledgerNodeID, to: m.from, owner: m.owner, attempt: m.attempt, cmd: m.cmd}
		r, gerr := w.ledgerStore.ReservationGet(w.ctx, m.cmd.ReservationID)
		if errors.Is(gerr, store.ErrNotFound) {
			// Removed by retention: the server answers from the tombstone
			// (engine.Engine.ReservationOrTombstone).
			var t ledger.Tombstone
			if t, gerr = w.ledgerStore.TombstoneGet(w.ctx, m.cmd.ReservationID); gerr == nil {
				r = t.Receipt()
			}
		}
		switch {
		case gerr == nil:
			answer.found = true
			answer.res = &ledger.Result{Reservation: r}
		case errors.Is(gerr, store.ErrNotFound):
		default:
			answer.kind = msgUnavailable
		}
		w.send(answer)
	}
}

// commit runs one batch through the engine's step function, retrying it
// whole on a conflict as engine.Engine does, and runs the checks on what
// became durable. It returns the results, or the error the callers see
// (with a lost acknowledgement the batch is durable although they hear it
// failed).
func (w *world) commit(cmds []ledger.Command, fault commitFault) ([]ledger.Result, error) {
	n := &w.ledger
	st := n.st
	var results []ledger.Result
	var err error
	commit := n.core.Commit
	if w.pipelined {
		commit = n.core.CommitDeferred
	}
	for attempt := 0; attempt < 4; attempt++ {
		st.fault = fault
		st.commits = 0
		results, err = commit(w.ctx, cmds, w.time())
		if st.commits == 0 && fault != faultNone && fault != faultCrash {
			// Nothing was written, so the store saw no commit; the fault
			// still hits the transaction (a read-only transaction that
			// fails, or whose answer is lost, looks the same to a caller).
			switch fault {
			case faultFail:
				err = fmt.Errorf("%w: injected commit failure", store.ErrUnavailable)
			case faultConflict:
				err = fmt.Errorf("%w: injected", store.ErrConflict)
			case faultLoseAck:
				err = fmt.Errorf("%w: acknowledgement lost", store.ErrUnavailable)
			}
		}
		st.fault = faultNone
		n.commits++
		w.chk.afterCommit(cmds)
		if w.fail != nil {
			return nil, err
		}
		if !errors.Is(err, store.ErrConflict) {
			break
		}
		w.log(recConflictRetry, ledgerNodeID, 0, "", int64(attempt+1), "")
		fault = faultNone
	}
	if err == nil {
		w.log(recCommit, ledgerNodeID, 0, "", int64(len(cmds)), "")
		if w.cfg.AuditEvery > 0 && n.commits%int64(w.cfg.AuditEvery) == 0 && len(st.unsynced) == 0 {
			w.chk.fullAudit("periodic audit")
		}
		return results, nil
	}
	if fault == faultLoseAck {
		w.log(recAckLost, ledgerNodeID, 0, "", int64(len(cmds)), "commit durable, acknowledgement lost")
	}
	return nil, err
}

func (w *world) crashLedger(when string) {
	n := &w.ledger
	w.crashUnsynced()
	if n.mem != nil {
		n.mem.Crash()
	} else if n.sqlite != nil {
		// The process dies, its database handle with it; the file keeps
		// what was committed, and is opened afresh (the observers read it
		// while the process is down, as they read the memstore).
		n.sqlite.Close()
		n.sqlite = nil
		w.openSQLite()
	}
	n.up = false
	n.dying = crashNone
	n.inbox = nil
	n.pending = false
	for i := range n.internal {
		w.internalFailed(&n.internal[i])
	}
	n.internal = nil
	n.incarnation++
	w.log(recCrash, ledgerNodeID, 0, "", int64(n.incarnation), when)
	w.after(w.between(restartMin, restartMax), evLedgerRestart, 0, 0, 0)
}

// ledgerRestart starts a new ledger process over the same store: a fresh
// engine.Core, no memory of the old process's batches. The checks then
// compare the store with everything seen committed (durability) and audit
// it whole.
func (w *world) ledgerRestart() {
	n := &w.ledger
	n.core = engine.NewCore(w.ledgerStore)
	n.up = true
	// A new process: no cut under way; the next cut is due every after
	// the store's last checkpoint, as for a restarted server.
	w.compaction.busy, w.compaction.cp = false, nil
	if w.compaction.on {
		w.compaction.lastCut = w.lastStoredCut()
	}
	w.log(recRestart, ledgerNodeID, 0, "", int64(n.incarnation), "")
	w.chk.fullAudit("after restart")
	w.op.policiesStale = true
}

// workerTick runs the ledger's background workers as the server's engine
// does, through the engine's own functions: engine.Core.Due every tick
// (expiry claims and completions, USAGE_UNKNOWN marking), and every
// epochEvery engine.Core.EpochsDue (epoch close) and engine.Core.DrainsDue
// (superseded generations' capacity and debt). Debt is repaid as in the
// server, lazily by the refill inside the subject's next command: no
// worker repays it. It reschedules itself unless extra is set (an extra
// run the start-vs-expire site asks for).
func (w *world) workerTick(extra bool) {
	if !extra {
		w.after(workerEvery, evWorker, 0, 0, 0)
	}
	n := &w.ledger
	if !n.up {
		return
	}
	if !extra && w.healed && w.quiescent() {
		w.finish()
		return
	}
	due, err := n.core.Due(w.ctx, w.time(), 64)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("engine.Core.Due: %v", err))
		return
	}
	for _, c := range due {
		n.internal = append(n.internal, internalCmd{cmd: c, from: fromWorker})
	}
	if !extra && w.now-n.lastEpochs >= epochEvery {
		n.lastEpochs = w.now
		cmds, err := n.core.EpochsDue(w.ctx, w.time())
		if err != nil {
			w.violate(GateJournal, fmt.Sprintf("engine.Core.EpochsDue: %v", err))
			return
		}
		for _, c := range cmds {
			n.internal = append(n.internal, internalCmd{cmd: c, from: fromWorker})
		}
		w.drainWork()
	}
	if !extra && w.retention.on && w.now-n.lastRetention >= retentionEvery {
		n.lastRetention = w.now
		cmds, err := n.core.RetentionDue(w.ctx, w.time(), w.retention.window, w.retention.horizon, 64)
		if err != nil {
			w.violate(GateJournal, fmt.Sprintf("engine.Core.RetentionDue: %v", err))
			return
		}
		for _, c := range cmds {
			n.internal = append(n.internal, internalCmd{cmd: c, from: fromWorker})
		}
		w.removeShards()
		if w.fail != nil {
			return
		}
	}
	if !extra {
		w.compactionTick()
		if w.fail != nil {
			return
		}
	}
	if !extra && w.healed {
		w.debtTraffic()
	}
	if len(n.internal) > 0 {
		w.log(recWorker, ledgerNodeID, 0, "", int64(len(n.internal)), "")
		w.scheduleBatch()
	}
}

// drainWork queues the drains engine.Core.DrainsDue returns. A drain of
// an indebted account repays debt (lost_debt_repayment_ack may hit its
// batch), and duplicate_recovery delivers a drain twice: once more in this
// batch and once in a later one.
func (w *world) drainWork() {
	n := &w.ledger
	drains, err := n.core.DrainsDue(w.ctx)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("engine.Core.DrainsDue: %v", err))
		return
	}
	for _, cmd := range drains {
		c := internalCmd{cmd: cmd, from: fromWorker, debtPay: w.chk.inDebt(cmd.Account)}
		n.internal = append(n.internal, c)
		if w.f.fire(SiteDuplicateRecovery) {
			n.internal = append(n.internal, c)
			n.lateDrains = append(n.lateDrains, c)
		}
	}
	if len(n.lateDrains) > 0 && w.chance(0.5) {
		n.internal = append(n.internal, n.lateDrains...)
		n.lateDrains = n.lateDrains[:0]
	}
}

// debtTraffic is the gateways' traffic after the faults healed: a tenant
// whose current account owes debt and who has no request open gets a new
// request. Its reserve is refused while the debt freezes admission (and
// retried after Retry-After), and the refill inside each of those reserves
// repays the debt, as in production; no simulated worker repays it.
func (w *world) debtTraffic() {
	w.op.refresh(w)
	for t := range w.tenants {
		subject := ledger.PolicyKey{Subject: w.tenants[t].subject, Route: route, Region: region}
		active := w.op.activeGeneration(subject)
		if active == 0 {
			continue
		}
		key := ledger.AccountKey{Subject: subject.Subject, Route: route, Region: region, Generation: active}
		if !w.chk.inDebt(key) || w.tenantBusy(t) {
			continue
		}
		r := w.newRequest(w.rng.IntN(w.shape.gateways), t, w.now)
		w.schedule(event{at: w.now, kind: evArrival, a: r.idx})
	}
}

// tenantBusy reports whether tenant t has a request that is not done.
func (w *world) tenantBusy(t int) bool {
	for _, r := range w.requests {
		if r.tenant == t && r.phase != phDone {
			return true
		}
	}
	return false
}

// internalAnswer delivers a committed internal command's result. Worker
// commands need none: the next tick finds whatever is still due.
func (w *world) internalAnswer(ic *internalCmd, res *ledger.Result) {
	if ic.from == fromOperator {
		w.op.answered(w, ic, res)
	}
}

// internalFailed tells an internal command's origin that its batch failed
// (it may or may not have been applied).
func (w *world) internalFailed(ic *internalCmd) {
	if ic.from == fromOperator {
		w.op.failed(w, ic)
	}
}

// Pipelined durability (Config.PipelinedShare).

// fsyncMin and fsyncMax bound a simulated fsync of the ledger's log.
const (
	fsyncMin = int64(200 * time.Microsecond)
	fsyncMax = int64(5 * time.Millisecond)
)

// startSync starts a simulated fsync unless one is in flight; it covers
// the batches committed before it began.
func (w *world) startSync() {
	n := &w.ledger
	if n.syncing || len(n.awaiting) == 0 && len(n.st.unsynced) == 0 {
		return
	}
	n.syncing = true
	n.syncCovers = len(n.awaiting)
	w.after(w.between(fsyncMin, fsyncMax), evSync, n.incarnation, 0, 0)
}

// ledgerSynced is the end of a simulated fsync: engine.Core.Sync makes
// the store's deferred commits durable, the checker sees them, and the
// batches the fsync covered are answered; a later batch waits for the
// next fsync, which starts at once.
func (w *world) ledgerSynced(incarnation int32) {
	n := &w.ledger
	if !n.up || n.incarnation != incarnation || !n.syncing {
		return // the process died with the fsync in flight
	}
	n.syncing = false
	if err := n.core.Sync(w.ctx); err != nil {
		w.violate(GateJournal, fmt.Sprintf("engine.Core.Sync: %v", err))
		return
	}
	n.st.synced()
	w.chk.afterCommit(nil)
	if w.fail != nil {
		return
	}
	w.log(recSync, ledgerNodeID, 0, "", int64(n.syncCovers), "")
	covered := n.awaiting[:n.syncCovers]
	n.awaiting = n.awaiting[n.syncCovers:]
	for _, b := range covered {
		w.ledgerAnswer(b.inbox, b.internal, b.owners, b.results, nil)
	}
	w.startSync()
}

// crashUnsynced settles what a crash does to the commits no fsync has
// made durable yet: their answers are never sent (the internal commands'
// origins hear that the outcome is unknown), and the commits either
// survive (the OS kept the writes: a process crash, and always on SQLite,
// whose file is only closed) or vanish together (a power loss with the
// process: memstore.LoseUnsynced).
func (w *world) crashUnsynced() {
	n := &w.ledger
	for _, b := range n.awaiting {
		for i := range b.internal {
			w.internalFailed(&b.internal[i])
		}
	}
	n.awaiting = nil
	n.syncing = false
	if len(n.st.unsynced) == 0 {
		return
	}
	if n.mem != nil && w.chance(0.5) {
		w.log(recUnsyncedLost, ledgerNodeID, 0, "", int64(len(n.st.unsynced)), "commits after the last fsync lost with the process")
		n.mem.LoseUnsynced()
		n.lostUnsynced += len(n.st.unsynced)
		n.st.unsynced = nil
		return
	}
	// Kept: durable now, as if synced (SQLite: Close leaves them in the
	// file).
	if n.sqlite != nil {
		if err := n.core.Sync(w.ctx); err != nil {
			w.violate(GateJournal, fmt.Sprintf("engine.Core.Sync: %v", err))
			return
		}
	} else {
		n.mem.Sync(w.ctx)
	}
	n.st.synced()
	w.chk.afterCommit(nil)
}
