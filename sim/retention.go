package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Retention in the simulation: in some interleavings the ledger process
// runs the retention worker's own function, engine.Core.RetentionDue (retire
// terminal reservations finished a window ago, forget tombstones past the
// horizon), every retentionEvery, its commands joining the next batch as
// the server's worker's do. The window is seconds instead of the 72 hours
// of production, so rows go while gateways and executors may still retry
// them: a lookup then answers from the tombstone, a settle retry gets the
// tombstone's "already settled", and the retention_retry site sends a
// finished request's reserve again, which must replay (from the row or
// the tombstone) and debit nothing. The checker follows every removal
// (checker.retention) and fails GateRetention for a removed reservation that
// was not finished, a tombstone that is not the reservation's, or a
// removed id debited again.

// retentionEvery is how often the retention worker runs.
const retentionEvery = int64(5 * time.Second)

// retentionSim is an interleaving's retention worker configuration.
type retentionSim struct {
	on bool
	// window is the retention window, horizon the tombstone horizon:
	// longer than any retry of a finished request in the simulation (a
	// gateway resolves RESERVATION_UNKNOWN within a few minutes), as 30
	// days is in production.
	window, horizon time.Duration
	// tombstoneReplays counts the reserves the ledger answered from a
	// tombstone.
	tombstoneReplays int64
	// retriesUntil is when the last retention_retry is due: the run has
	// not converged before it.
	retriesUntil int64
}

func (w *world) drawRetention() {
	if !w.chance(0.5) {
		return
	}
	w.retention = retentionSim{
		on:      true,
		window:  time.Duration(w.between(int64(2*time.Second), int64(60*time.Second))),
		horizon: time.Duration(w.between(int64(4*time.Minute), int64(6*time.Minute))),
	}
}

// retryAfterRetention fires the retention_retry site for a request that
// just finished with a central reservation: its reserve is sent again once
// the retention window may have passed.
func (w *world) retryAfterRetention(r *request) {
	if !w.retention.on || r.viaShard != 0 || w.chk.resv[r.id] == nil || !w.f.fire(SiteRetentionRetry) {
		return
	}
	delay := int64(w.retention.window) + w.between(int64(retentionEvery), int64(20*time.Second))
	w.after(delay, evLateRetry, 0, r.idx, 0)
	w.retention.retriesUntil = max(w.retention.retriesUntil, w.now+delay)
}

func (w *world) lateRetry(idx int32) {
	r := w.requests[idx]
	if !w.gateways[r.gw].up {
		return
	}
	cmd := w.reserveCommand(r)
	if r.record {
		cmd = w.recordCommand(r)
	}
	w.send(&message{kind: msgCommand, from: w.gatewayNode(r.gw), to: ledgerNodeID, owner: r.idx, late: true, cmd: cmd})
}

// lateRetryAnswer checks the answer to a retention_retry reserve: a replay
// of this very request (from its row, or its tombstone once retention
// removed it), nothing debited (the checker sees to that).
func (w *world) lateRetryAnswer(r *request, m *message) {
	if m.kind != msgAnswer {
		return
	}
	res := m.res
	if r.record {
		// checkRecordAnswer checked the receipt (or the tombstone's
		// answer) already; a retry must not have charged.
		if res.Err == nil && !res.Replayed {
			w.violate(GateRetention, fmt.Sprintf("a retry of finished record %s charged it again", r.id))
		}
		return
	}
	if res.Err != nil || !res.Replayed || res.Reservation.ID != r.id || res.Reservation.RequestDigest != r.digest {
		w.violate(GateRetention, fmt.Sprintf("a retry of finished reservation %s (digest %s) answered %v, replayed %v, receipt %s/%s: not a replay",
			r.id, r.digest, res.Err, res.Replayed, res.Reservation.ID, res.Reservation.RequestDigest))
		return
	}
	if res.Reservation.Retired {
		w.retention.tombstoneReplays++
	}
}

// settledBeforeRetention reports whether a settle's error says the
// reservation was settled and then removed by retention: a settle retry
// whose first attempt was applied (only this executor settles it).
func settledBeforeRetention(err error) bool {
	return errors.Is(err, ledger.ErrReservationRetired) && errors.Is(err, ledger.ErrReservationAlreadySettled)
}
