package sim

import (
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Records in the simulation (Config.RecordShare): a share of the gateways'
// requests take the path of a gateway that learns the cost only from the
// response, as Envoy AI Gateway's response-time cost does. Nothing is
// reserved: the gateway runs the work against the backend itself (no
// executor, no scheduler), then records the actual usage with
// ledger.Record (KindRecord) under the request's own id and operation id.
// A lost answer, an "unavailable" or a timeout sends the very same record
// again (same id, operation id and usage), as the client package's
// RecordUsage does, until a definite answer: the receipt, a replay of it,
// or, once retention removed the row, the tombstone's "already settled".
// The ledger never refuses a record for capacity: available pays first,
// the rest is debt (SETTLED_WITH_DEBT), which freezes the tenant's route
// until refills repay it (the debt traffic after healing repays it).
//
// The checker (checker.transition, KindRecord) sees to it that a record
// is charged exactly once (second_reservation for a charge of an id
// already recorded, retention for one retention had removed), that it
// holds nothing, moves exactly its usage into spent and issues as debt
// exactly what available lacked (unrecorded_debt); the end check wants
// every record settled with exactly its usage.

// RecordStats counts what the records of an interleaving (or a run) did.
type RecordStats struct {
	// Records is the records committed, WithDebt those SETTLED_WITH_DEBT.
	Records, WithDebt int64
	// Replays counts the answers to a retried record that were a replay
	// of the committed one; FromTombstone those answered from the
	// tombstone after retention removed it.
	Replays, FromTombstone int64
}

func (s *RecordStats) add(o *RecordStats) {
	s.Records += o.Records
	s.WithDebt += o.WithDebt
	s.Replays += o.Replays
	s.FromTombstone += o.FromTombstone
}

// recordDigest is a record's request digest: it names the subject, route
// and region (as the server's RecordDigest does; the usage is compared by
// the ledger), with a prefix no reserve's digest has.
func recordDigest(t *tenant) string {
	return ledger.RecordDigestPrefix + t.subject + "/" + route + "/" + region
}

func (w *world) recordCommand(r *request) ledger.Command {
	t := &w.tenants[r.tenant]
	return ledger.Command{Kind: ledger.KindRecord, ReservationID: r.id, RequestDigest: r.digest, OperationID: r.opID,
		Subject: t.subject, Route: route, Region: region, Units: r.actual}
}

// arriveRecord starts a record request: the gateway runs the work at once,
// with nothing reserved.
func (w *world) arriveRecord(r *request) {
	w.log(recArrive, w.gatewayNode(r.gw), ledger.KindRecord, r.id, int64(r.tenant), "record: no reservation")
	r.phase = phWorking
	r.opID = "op-" + r.id
	// Records count tokens only: the other units may be dropped by the
	// generation deciding when the usage is recorded.
	for d := 1; d < len(r.units); d++ {
		r.units[d] = 0
	}
	w.after(w.between(int64(200*time.Millisecond), int64(15*time.Second)), evRecordWork, 0, r.idx, 0)
}

// recordWorkDone: the backend answered with the usage (sometimes above
// the request's expected size: usage_over_estimate), and the gateway
// records it.
func (w *world) recordWorkDone(idx int32) {
	r := w.requests[idx]
	w.drawActual(r)
	if r.actual == (ledger.Amounts{}) {
		r.actual[0] = 1 // a response that used nothing is not recorded; this one used a token
	}
	r.started, r.receipt = true, true
	w.log(recOpDone, w.gatewayNode(r.gw), ledger.KindRecord, r.id, r.actual[0], "")
	w.sendRecord(r)
}

func (w *world) sendRecord(r *request) {
	r.phase = phRecording
	r.attempt++
	node := w.gatewayNode(r.gw)
	w.send(&message{kind: msgCommand, from: node, to: ledgerNodeID, owner: r.idx, attempt: r.attempt, cmd: w.recordCommand(r)})
	w.after(rpcTimeout, evTimer, node, r.idx, r.attempt)
}

// recordUnknown: the record's outcome is unknown to the gateway (lost
// answer, "unavailable", timeout); it records again with the same values.
func (w *world) recordUnknown(r *request) {
	if r.settleUnknownSince < 0 {
		r.settleUnknownSince = w.now
		w.log(recUnknown, w.gatewayNode(r.gw), ledger.KindRecord, r.id, 0, "record outcome unknown: same id again")
	}
	w.sendRecord(r)
}

// checkRecordAnswer checks every answer to a record, stale or not, with
// what a correct ledger can answer: the request's own receipt (id,
// digest, operation id, usage, holding nothing, settled), charged by one
// answer only (a replay charges nothing; network duplicates of one answer
// aside), or, after retention removed it, a replay from the tombstone
// (Retired set, no usage) of a record the checker saw committed with this
// usage.
func (w *world) checkRecordAnswer(r *request, m *message) {
	if m.kind != msgAnswer || m.cmd.Kind != ledger.KindRecord {
		return
	}
	res := m.res
	switch {
	case res.Err == nil && res.Reservation.Retired:
		rs := w.chk.resv[r.id]
		rv := &res.Reservation
		if !res.Replayed || rs == nil || !rs.retired || rs.actual != r.actual || rv.ID != r.id || rv.RequestDigest != r.digest ||
			(rv.State != ledger.StateSettled && rv.State != ledger.StateSettledWithDebt) {
			w.violate(GateProtocol, fmt.Sprintf("record of %s with %v answered %s from a tombstone (replayed %v), but no record of it with that usage was removed by retention (%+v)",
				r.id, r.actual, rv.State, res.Replayed, rs))
			return
		}
		w.recordStats.FromTombstone++
	case res.Err == nil:
		rv := &res.Reservation
		if rv.ID != r.id || rv.RequestDigest != r.digest || rv.OperationID != r.opID || rv.Actual != r.actual ||
			rv.Reserved != (ledger.Amounts{}) || (rv.State != ledger.StateSettled && rv.State != ledger.StateSettledWithDebt) {
			w.violate(GateProtocol, fmt.Sprintf("record of %s (operation %s, usage %v) answered the receipt of %s: %s, operation %q, holding %v, usage %v",
				r.id, r.opID, r.actual, rv.ID, rv.State, rv.OperationID, rv.Reserved, rv.Actual))
			return
		}
		if res.Replayed {
			w.recordStats.Replays++
			return
		}
		if r.chargeAnswer == m.answerID {
			return // a network duplicate of the same answer
		}
		if r.chargeAnswer != 0 {
			w.violate(GateSecondReservation, fmt.Sprintf("record %s charged by a second answer (not a replay): a retry must replay", r.id))
			return
		}
		r.chargeAnswer = m.answerID
	case settledBeforeRetention(res.Err):
		w.violate(GateProtocol, fmt.Sprintf("record of %s with %v answered %v: a retry with the same digest replays from the tombstone", r.id, r.actual, res.Err))
	default:
		w.violate(GateProtocol, fmt.Sprintf("record of %s (operation %s, usage %v) answered %v: the usage is lost", r.id, r.opID, r.actual, res.Err))
	}
}

// recordAnswer ends a record request on a definite answer (checked by
// checkRecordAnswer before).
func (w *world) recordAnswer(r *request, res *ledger.Result) {
	if res.Err != nil {
		return
	}
	if r.settleUnknownSince >= 0 {
		w.log(recResolved, w.gatewayNode(r.gw), ledger.KindRecord, r.id, w.now-r.settleUnknownSince, "record outcome")
		r.settleUnknownSince = -1
	}
	w.done(r, outRecorded)
}
