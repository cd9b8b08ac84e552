package engine

import (
	"context"
	"time"
)

// Maintenance pacing. Retention pages, journal compaction, giving space
// back and audits all run on the same store as admission (on SQLite, the
// same single writer and the same cores), so each works in steps and,
// after every step, pauses long enough that its steps take at most a
// share of the wall time: MaintenanceShare while gateways' commands are
// being committed, more when nothing else is (a step that took d is
// followed by a pause of d*(1-share)/share). The busy test is this
// engine's own admissions since the step before: on PostgreSQL the worker
// leader does not see what the other replicas admit.

// DefaultMaintenanceShare is the share of wall time maintenance steps
// take while gateways are being admitted: retention then gets a fifth of
// the time, enough to remove about 1,500 rows a second when each page
// waits 20 ms for a busy committer (docs/OPERATIONS.md, "Retention and
// compaction"), and admission keeps the rest.
const DefaultMaintenanceShare = 0.2

// pacer spaces one worker's steps.
type pacer struct {
	e *Engine
	// busy and idle are the shares of wall time the steps take while
	// admission is busy and while it is idle; 1 means no pause.
	busy, idle float64
	seen       uint64
	// most, when positive, caps every pause.
	most time.Duration
	// owed is the pause of the steps counted by owe and not yet taken;
	// once repaying, wait takes part of it after every step, and repay
	// the rest.
	owed     time.Duration
	repaying bool
	// sleep pauses for d and reports whether ctx is still live;
	// pacerMade (tests) may replace it.
	sleep func(ctx context.Context, d time.Duration) bool
}

// newPacer returns a pacer whose steps take the engine's
// MaintenanceShare of the time while admission is busy and idle of it
// otherwise.
func (e *Engine) newPacer(idle float64) *pacer {
	return e.makePacer(e.opts.MaintenanceShare, idle)
}

// makePacer returns a pacer with these shares (and shows it to
// pacerMade, in tests).
func (e *Engine) makePacer(busy, idle float64) *pacer {
	p := &pacer{e: e, busy: busy, idle: idle, seen: e.admitted(), sleep: sleepFor}
	if e.pacerMade != nil {
		e.pacerMade(p)
	}
	return p
}

// auditShareDivisor: an audit's steps take a tenth of MaintenanceShare
// while admission is busy. An audit is CPU alone, on the cores admission
// needs, and whoever waits for it sees its progress; retention must keep
// up with what finishes and gets the whole share. Measured: back-to-back
// full audits at the whole share (0.2) cost reserves 0.58x their
// throughput (commit e15b4de); at a quarter of it their p99 1.17-1.28x,
// at a tenth 0.90-1.07x over 60 s windows (docs/PERFORMANCE.md, "Bounded
// history").
const auditShareDivisor = 10

// deferrableShareDivisor: giving space back and deleting a summarised
// journal take a quarter of MaintenanceShare while gateways are admitted
// (newDeferrablePacer).
const deferrableShareDivisor = 4

// newAuditPacer is newPacer for an audit.
func (e *Engine) newAuditPacer(idle float64) *pacer {
	p := e.makePacer(e.opts.MaintenanceShare/auditShareDivisor, idle)
	p.most = auditMaxPause
	return p
}

// auditMaxPause is the longest pause of an audit's step (or a copy's in
// its read): a step's time is wall time, which on a loaded machine is
// mostly waiting for a core, and at an audit's share a step of 0.6 s was
// followed by more than 10 s of nothing, the audit (and on SQLite the
// read that holds the WAL) that much longer for no CPU saved.
const auditMaxPause = time.Second

// newDeferrablePacer is the pacer of maintenance that nothing in steady
// state waits for: giving freed space back (SQLite reuses free pages
// without it) and deleting journal rows a checkpoint already summarises
// beyond keeping up with what is written (CompactJournal: journalKeepUp).
// It takes a quarter of MaintenanceShare while gateways are admitted
// (a disk that waits for its space fills; nobody waits on an audit's
// pace but its caller), and idle of the time otherwise.
func (e *Engine) newDeferrablePacer(idle float64) *pacer {
	p := e.makePacer(e.opts.MaintenanceShare/deferrableShareDivisor, idle)
	p.most = auditMaxPause
	return p
}

// copyStep is the least a step of a store's copy inside an audit's
// read (SQLite's audit copy) lasts before the pause it owes is counted
// (pacer.owe): the copy does not stop between its steps, and a step as
// short as auditStep (2 ms) can see no admission since the one before
// while the committer commits a batch, count as idle and owe nothing.
const copyStep = 50 * time.Millisecond

// admitted counts the commands this engine committed that none of its
// maintenance workers submitted (doMaintenance). Counted per committed
// request: a count of what the workers had submitted, taken apart from
// the committed total, differed from it while a worker's page was being
// committed chunk by chunk, and a pass of the expiry worker read as
// admission to every pacer for its whole length (docs/PERFORMANCE.md,
// "RSS and the checkpoint cut").
func (e *Engine) admitted() uint64 {
	return e.admittedCmds.Load()
}

// share is the share of time the next pause leaves the steps, and
// whether admission was busy since the last call.
func (p *pacer) share() (float64, bool) {
	now := p.e.admitted()
	busy := now != p.seen
	p.seen = now
	if busy {
		return p.busy, true
	}
	return p.idle, false
}

// pause is how long to pause after a step that took took, at least
// floor.
func (p *pacer) pause(took, floor time.Duration) time.Duration {
	share, _ := p.share()
	d := max(floor, pauseFor(took, share))
	if p.most > 0 {
		d = min(d, p.most)
	}
	return d
}

// pauseFor is the pause after a step that took took which keeps a series
// of such steps to share of the wall time: took*(1-share)/share, none at
// a share of 1 or more. Every pacing of maintenance work (this file's
// pacer, the workers' workerPacer) uses it.
func pauseFor(took time.Duration, share float64) time.Duration {
	if share >= 1 {
		return 0
	}
	return time.Duration(float64(took) * (1 - share) / share)
}

// wait pauses after a step that took took, at least floor, and reports
// whether ctx is still live. Once repaying, the pause also takes up to
// twice itself of what is owed: a copy's owed pauses (owe) spread over
// the steps after its read, which then go on at a third of their speed,
// instead of one pause of seconds during which nothing moves.
func (p *pacer) wait(ctx context.Context, took, floor time.Duration) bool {
	d := p.pause(took, floor)
	if p.repaying && p.owed > 0 {
		extra := min(p.owed, 2*d)
		p.owed -= extra
		d += extra
	}
	return p.sleep(ctx, d)
}

// owe is wait for a copy that may slow down inside its read but must
// not stop for long (SQLite's audit copy: its open read keeps the WAL from
// being restarted): it pauses at most as long as the step took (the copy
// at least at half speed) and owes the rest of the step's pause, which
// wait and repay take once the read has ended, so that the copy still takes no
// more than its share of the time. At full speed inside the read, a copy
// of 300,000 reservations took a core for some 0.7 s at once; reserves
// beside full audits ran at 1.07x their p99 at half speed against 1.17x
// at full speed in one series, 1.14-1.33x at half speed in three more,
// with the WAL behind the read at 67-203 MB; at a quarter speed 1.15x
// against half speed's 1.25x, but 146-252 MB (docs/PERFORMANCE.md,
// "Bounded history"). What it owes is not capped at the pacer's most,
// as a reading step's pause is: the debt is taken spread over the
// reading, and a cap made the copy take about 5 % of the time whatever
// the share.
func (p *pacer) owe(ctx context.Context, took time.Duration) {
	share, _ := p.share()
	d := pauseFor(took, share)
	inside := min(d, took)
	p.sleep(ctx, inside)
	p.owed += d - inside
}

// repay takes what is still owed in one pause, and reports whether ctx
// is still live.
func (p *pacer) repay(ctx context.Context) bool {
	d := p.owed
	p.owed = 0
	return p.sleep(ctx, d)
}

// sleepFor pauses for d, returning early with false when ctx ends.
func sleepFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	pause := time.NewTimer(d)
	defer pause.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-pause.C:
		return true
	}
}
