package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
)

// executor runs reserved requests: it starts the reservation with its
// operation id (compare-and-set RESERVED -> STARTED) before any work, lets
// the backend run the operation, and settles with the backend's operation
// receipt. Its job log and the receipts are durable; the rest dies with the
// process.
type executor struct {
	index int
	up    bool
	q     execSched
}

// job hands a dispatched request to its executor.
func (w *world) job(idx int32) {
	r := w.requests[idx]
	node := w.executorNode(r.exec)
	r.opPhase = opQueued
	r.opID = "op-" + r.id
	w.log(recJob, node, 0, r.id, 0, "")
	if !w.execs[r.exec].up {
		return // in the durable job log; queued again on restart
	}
	r.schedKnown = true
	w.enqueue(r)
}

// startOp sends the start. When the start-vs-expire site fires, the start
// is timed to reach the ledger right at the hold's expiry, and the expiry
// worker is made to run at that same instant.
func (w *world) startOp(r *request) {
	r.opPhase = opStarting
	r.slot = true
	// A backlog request starts at once (see drawActual).
	if !r.backlog && r.expiresAt > w.now+int64(10*time.Millisecond) && w.f.fire(SiteStartVersusExpire) {
		r.opAttempt++
		at := r.expiresAt - netMin + w.between(-int64(3*time.Millisecond), int64(3*time.Millisecond))
		w.schedule(event{at: at, kind: evStart, b: r.idx, c: r.opAttempt})
		w.schedule(event{at: r.expiresAt, kind: evWorker, a: 1})
		return
	}
	w.sendStart(r, w.between(netMin, netMax))
}

func (w *world) delayedStart(idx, attempt int32) {
	r := w.requests[idx]
	if r.opPhase != opStarting || r.opAttempt != attempt || !w.execs[r.exec].up {
		return
	}
	w.sendStart(r, netMin)
}

func (w *world) sendStart(r *request, delay int64) {
	r.opPhase = opStarting
	r.opAttempt++
	node := w.executorNode(r.exec)
	w.sendWithDelay(&message{kind: msgCommand, from: node, to: ledgerNodeID, owner: r.idx, attempt: r.opAttempt,
		cmd: ledger.Command{Kind: ledger.KindStart, ReservationID: r.id, OperationID: r.opID}}, delay)
	w.after(rpcTimeout, evTimer, node, r.idx, r.opAttempt)
}

func (w *world) sendSettle(r *request) {
	r.opPhase = opSettling
	r.opAttempt++
	node := w.executorNode(r.exec)
	w.send(&message{kind: msgCommand, from: node, to: ledgerNodeID, owner: r.idx, attempt: r.opAttempt,
		cmd: ledger.Command{Kind: ledger.KindSettle, ReservationID: r.id, OperationID: r.opID, Units: r.actual}})
	w.after(rpcTimeout, evTimer, node, r.idx, r.opAttempt)
}

// executorUnknown handles a lost or failed answer: the same start or the
// same settle (same operation id, same actual usage) is sent again. A
// settle whose outcome is unknown is USAGE_UNKNOWN for the caller until a
// definite answer arrives.
func (w *world) executorUnknown(r *request) {
	switch r.opPhase {
	case opStarting:
		w.sendStart(r, w.between(netMin, netMax))
	case opSettling:
		if r.settleUnknownSince < 0 {
			r.settleUnknownSince = w.now
			w.log(recUnknown, w.executorNode(r.exec), ledger.KindSettle, r.id, 0, "USAGE_UNKNOWN")
		}
		w.sendSettle(r)
	}
}

func (w *world) executorReceive(m *message) {
	r := w.requests[m.owner]
	node := w.executorNode(r.exec)
	if !w.execs[r.exec].up {
		w.log(recDownDrop, node, m.cmd.Kind, r.id, 0, "executor down")
		return
	}
	w.log(recDeliver, node, m.cmd.Kind, r.id, int64(m.attempt), msgNames[m.kind])
	if m.kind == msgAnswer {
		w.checkRefundAnswer(r, m)
		if w.fail != nil {
			return
		}
	}
	if m.attempt != r.opAttempt || r.opPhase == opDone {
		w.log(recStale, node, m.cmd.Kind, r.id, int64(m.attempt), "")
		return
	}
	if m.kind == msgUnavailable {
		w.executorUnknown(r)
		return
	}
	switch {
	case m.cmd.Kind == ledger.KindStart && r.opPhase == opStarting:
		w.startAnswer(r, m.res)
	case m.cmd.Kind == ledger.KindSettle && r.opPhase == opSettling:
		w.settleAnswer(r, m.res)
	}
}

func (w *world) startAnswer(r *request, res *ledger.Result) {
	switch {
	case res.Err == nil:
		if res.Reservation.OperationID != r.opID || res.Reservation.State != ledger.StateStarted && !res.Replayed {
			w.violate(GateProtocol, fmt.Sprintf("start of %s answered %s with operation %q", r.id, res.Reservation.State, res.Reservation.OperationID))
			return
		}
		r.opPhase = opRunning
		r.started = true
		p := w.op.base[w.tenants[r.tenant].key]
		limit := int64(p.ExecutionLimit)
		run := w.between(int64(200*time.Millisecond), min(limit-int64(time.Second), int64(15*time.Second)))
		if r.backlog {
			run = w.between(int64(50*time.Millisecond), int64(300*time.Millisecond))
		}
		if w.f.fire(SiteExecutionOverrun) {
			run = limit + w.between(int64(time.Second), int64(60*time.Second))
		}
		// The backend runs the operation whatever happens to the executor.
		w.after(run, evOpDone, 0, r.idx, 0)
	case errors.Is(res.Err, ledger.ErrReservationExpired), errors.Is(res.Err, ledger.ErrReservationReleased):
		// Expiry won the race: nothing ran, nothing is owed.
		r.opPhase = opDone
		w.done(r, outExpired)
		w.slotFree(r, 0)
	default:
		w.violate(GateProtocol, fmt.Sprintf("start of %s answered %v", r.id, res.Err))
	}
}

// drawActual sets the usage the backend reports for r: tokens (the first
// dimension) anywhere up to the estimate, or above it when the
// over-estimate fault fires; every other dimension exactly as estimated.
func (w *world) drawActual(r *request) {
	if r.backlog {
		// A backlog request uses what it reserved and is never timed
		// against its hold's expiry, so that its scheduler's fairness
		// bound has no estimate error in it (E = 0); the over-estimate
		// and start-vs-expire sites fire on every other request.
		r.actual = r.units
		return
	}
	over := w.f.fire(SiteUsageOverEstimate)
	for d := range r.units {
		switch {
		case r.units[d] == 0:
		case d > 0 && over && r.viaShard != 0:
			// Through a shard the overuse is 1-2 (2-3x the hold of 1),
			// so that one request can pass the shard's allocation of 2:
			// debt beyond the shard in a unit after tokens, which a
			// generation dropping that unit may decide when the shard
			// is reconciled (ledger.remintShard charges it to the
			// shard's own account then).
			r.actual[d] = r.units[d] + w.between(1, 2)
		case d > 0 && w.shape.dims > 2 && (over || w.chance(0.25)):
			// With three units, 1-3 more, also without the site a
			// quarter of the time: accounts stepping down the units
			// owe in them often, so that two owe in different dropped
			// units at once.
			r.actual[d] = r.units[d] + w.between(1, 3)
		case d > 0 && over:
			// A retried call counts twice: the unit owes debt
			// too, so a generation may drop a unit the subject owes in.
			r.actual[d] = r.units[d] + w.between(0, 1)
		case d > 0:
			r.actual[d] = r.units[d]
		case over:
			r.actual[d] = r.units[d] + w.between(1, 2*r.units[d])
		default:
			r.actual[d] = w.between(0, r.units[d])
		}
	}
}

// opDone: the backend finished the operation and wrote its receipt with the
// actual usage, sometimes above the estimate.
func (w *world) opDone(idx int32) {
	r := w.requests[idx]
	w.drawActual(r)
	r.receipt = true
	w.log(recOpDone, w.executorNode(r.exec), 0, r.id, r.actual[0], "")
	if w.execs[r.exec].up && r.opPhase == opRunning {
		w.sendSettle(r)
	}
	w.slotFree(r, r.actual[0])
}

func (w *world) settleAnswer(r *request, res *ledger.Result) {
	switch {
	case res.Err == nil:
		if res.Reservation.Actual != r.actual || res.Reservation.OperationID != r.opID {
			w.violate(GateUnrecordedDebt, fmt.Sprintf("settle of %s with %v recorded %v (operation %q)", r.id, r.actual, res.Reservation.Actual, res.Reservation.OperationID))
			return
		}
		if r.settleUnknownSince >= 0 {
			d := w.now - r.settleUnknownSince
			w.usageUnknown = append(w.usageUnknown, d)
			w.log(recResolved, w.executorNode(r.exec), ledger.KindSettle, r.id, d, "USAGE_UNKNOWN")
			r.settleUnknownSince = -1
		}
		r.opPhase = opDone
		w.done(r, outSettled)
	case settledBeforeRetention(res.Err):
		// An earlier copy of this settle was applied (the checker checked
		// its usage then) and retention has removed the row since.
		r.opPhase = opDone
		w.done(r, outSettled)
	case errors.Is(res.Err, ledger.ErrReservationExpired), errors.Is(res.Err, ledger.ErrReservationReleased):
		w.violate(GateUnknownAsUnconsumed, fmt.Sprintf("started operation %s of %s used %v, but its settle was refused: %v", r.opID, r.id, r.actual, res.Err))
	default:
		w.violate(GateProtocol, fmt.Sprintf("settle of %s answered %v", r.id, res.Err))
	}
}

func (w *world) crashExecutor(i int) {
	e := &w.execs[i]
	if !e.up {
		return
	}
	e.up = false
	for _, r := range w.requests {
		if r.exec == i && r.phase == phDispatched && r.opPhase != opDone {
			r.opAttempt++ // the dead process's timers and answers are stale
			// The scheduler's memory dies with the process; the requests it
			// dispatched keep their slots until their operations end.
			r.schedKnown = false
		}
	}
	e.q.open, e.q.stretchOn = false, false // the fairness window and stretch die with it
	w.log(recExecCrash, w.executorNode(i), 0, "", 0, "")
	w.after(w.between(execRestartLo, execRestartHi), evExecRestart, int32(i), 0, 0)
}

// executorRestart brings an executor back: it replays its durable job log.
// Starts and settles are sent again with the same operation ids; finished
// operations settle from the backend's receipts.
func (w *world) executorRestart(i int) {
	e := &w.execs[i]
	e.up = true
	w.log(recExecRestart, w.executorNode(i), 0, "", 0, "")
	w.newExecSched(e)
	for _, r := range w.requests {
		if r.exec != i || r.phase != phDispatched {
			continue
		}
		switch r.opPhase {
		case opQueued:
			r.schedKnown = true
			w.enqueue(r)
		case opStarting:
			w.sendStart(r, w.between(netMin, netMax))
		case opRunning:
			if r.receipt {
				w.sendSettle(r)
			}
		case opSettling:
			w.sendSettle(r)
		}
	}
}
