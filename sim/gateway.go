package sim

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/capledger/capledger/ledger"
)

// reqPhase is where a request is in the gateway's client protocol.
type reqPhase uint8

const (
	phPending    reqPhase = iota // not arrived yet
	phReserving                  // reserve sent, waiting for its answer
	phLookup                     // RESERVATION_UNKNOWN: looking the id up
	phBackoff                    // rejected, waiting Retry-After
	phDispatched                 // handed to an executor
	phReleasing                  // release sent (the client gave up before starting)
	phDone
	phWorking   // a record: the work runs, nothing reserved
	phRecording // a record: the usage sent, waiting for its answer
)

var phaseNames = [...]string{"pending", "reserving", "lookup", "backoff", "dispatched", "releasing", "done", "working", "recording"}

func (p reqPhase) String() string { return phaseNames[p] }

// opPhase is where the executor is with a request's operation.
type opPhase uint8

const (
	opNone     opPhase = iota
	opQueued           // in the executor's durable job log
	opStarting         // start sent (or timed for the expiry race)
	opRunning          // STARTED; the backend runs it
	opSettling         // receipt in hand, settle sent
	opDone
)

var opPhaseNames = [...]string{"none", "queued", "starting", "running", "settling", "done"}

func (p opPhase) String() string { return opPhaseNames[p] }

// outcome is how a request ended.
type outcome uint8

const (
	outNone outcome = iota
	outSettled
	outReleased
	outExpired
	outRejected
	outNoPolicy
	outRecorded
)

var outcomeNames = [...]string{"none", "settled", "released", "expired", "rejected", "no-policy", "recorded"}

// request is one client request through a gateway and, once reserved, an
// executor. The reservation id is chosen once, by the gateway, and never
// changes: every retry and every lookup uses it.
type request struct {
	idx     int32
	gw      int
	tenant  int
	id      string
	digest  string
	units   ledger.Amounts
	arrival int64

	phase        reqPhase
	attempt      int32
	tries        int
	unknownSince int64 // RESERVATION_UNKNOWN since (simulated ns), -1 when not
	outcome      outcome
	expiresAt    int64

	exec               int
	opID               string
	opPhase            opPhase
	opAttempt          int32
	started            bool
	receipt            bool // the backend's operation receipt exists
	actual             ledger.Amounts
	settleUnknownSince int64
	refundAnswer       int64 // the answer that carried the refund, 0 before
	viaShard           int32 // 1 + index of the shard that admitted it, 0 for the ledger
	slot               bool  // holds one of its executor's slots
	schedKnown         bool  // queued or in flight in its executor's scheduler
	// backlog marks a request of a backlog burst: small, short, and all
	// run on executor 0, so that its scheduler has queues to be fair with.
	backlog bool
	// record: the request reserves nothing and records its usage after
	// the work (record.go); chargeAnswer is the answer that carried its
	// charge, 0 before.
	record       bool
	chargeAnswer int64
}

// gateway is a gateway replica. Its requests live in world.requests.
type gateway struct {
	up        bool
	bootEpoch uint64
}

// tenant is one subject with the policy key that governs it.
type tenant struct {
	subject string
	key     ledger.PolicyKey
}

const (
	route  = "chat.generate"
	region = "eu"
)

func (w *world) newRequest(gw, tenant int, arrival int64) *request {
	r := &request{
		idx:                int32(len(w.requests)),
		gw:                 gw,
		tenant:             tenant,
		arrival:            arrival,
		unknownSince:       -1,
		settleUnknownSince: -1,
	}
	r.id = "g" + strconv.Itoa(gw) + "-r" + strconv.Itoa(int(r.idx))
	p := w.op.base[w.tenants[tenant].key]
	r.units[0] = w.between(20, p.Dimensions[0].Burst/2)
	for d := 1; d < len(p.Dimensions); d++ {
		r.units[d] = 1
	}
	r.digest = digestOf(r)
	w.requests = append(w.requests, r)
	return r
}

// digestOf is the canonical request digest: a hash of what the request
// asks for, so a retry carries the same digest and another request does not.
func digestOf(r *request) string {
	h := uint64(fnvOffset)
	mix := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= fnvPrime
		}
	}
	mix(r.id)
	mix(strconv.Itoa(r.tenant))
	for _, u := range r.units {
		mix(strconv.FormatInt(u, 10))
	}
	return "sha256:" + strconv.FormatUint(h, 16)
}

func (w *world) reserveCommand(r *request) ledger.Command {
	t := &w.tenants[r.tenant]
	return ledger.Command{Kind: ledger.KindReserve, ReservationID: r.id, RequestDigest: r.digest,
		Subject: t.subject, Route: route, Region: region, Units: r.units}
}

// arrive starts a request: its gateway sends the reserve. When the
// concurrent-reserve site fires, another gateway reserves for the same
// tenant at the same instant with the same network delay, so both land in
// the ledger's same batch.
func (w *world) arrive(idx int32) {
	r := w.requests[idx]
	if r.record {
		w.arriveRecord(r)
		return
	}
	node := w.gatewayNode(r.gw)
	w.log(recArrive, node, ledger.KindReserve, r.id, int64(r.tenant), "")
	if w.tryShard(r) {
		return
	}
	r.phase = phReserving
	w.shapeUnits(r)
	if w.f.fire(SiteConcurrentReserve) {
		other := (r.gw + 1 + w.rng.IntN(w.shape.gateways-1)) % w.shape.gateways
		twin := w.newRequest(other, r.tenant, w.now)
		w.shapeUnits(twin)
		twin.phase = phReserving
		w.log(recArrive, w.gatewayNode(other), ledger.KindReserve, twin.id, int64(twin.tenant), "concurrent")
		delay := w.between(netMin, netMax)
		w.sendReserve(r, delay)
		w.sendReserve(twin, delay)
		return
	}
	w.sendReserve(r, w.between(netMin, netMax))
}

func (w *world) sendReserve(r *request, delay int64) {
	r.phase = phReserving
	r.attempt++
	node := w.gatewayNode(r.gw)
	w.sendWithDelay(&message{kind: msgCommand, from: node, to: ledgerNodeID, owner: r.idx, attempt: r.attempt, cmd: w.reserveCommand(r)}, delay)
	w.after(rpcTimeout, evTimer, node, r.idx, r.attempt)
}

func (w *world) sendLookup(r *request) {
	r.phase = phLookup
	r.attempt++
	node := w.gatewayNode(r.gw)
	w.send(&message{kind: msgLookup, from: node, to: ledgerNodeID, owner: r.idx, attempt: r.attempt,
		cmd: ledger.Command{ReservationID: r.id}})
	w.after(rpcTimeout, evTimer, node, r.idx, r.attempt)
}

func (w *world) sendRelease(r *request) {
	r.phase = phReleasing
	r.attempt++
	node := w.gatewayNode(r.gw)
	m := &message{kind: msgCommand, from: node, to: ledgerNodeID, owner: r.idx, attempt: r.attempt,
		cmd: ledger.Command{Kind: ledger.KindRelease, ReservationID: r.id}}
	w.send(m)
	if w.f.fire(SiteDuplicateRecovery) {
		dup := *m
		w.send(&dup)
	}
	w.after(rpcTimeout, evTimer, node, r.idx, r.attempt)
}

// timer fires an rpc timeout of a gateway or executor; stale ones (the
// request moved on) are ignored.
func (w *world) timer(node, idx, attempt int32) {
	r := w.requests[idx]
	if w.isGateway(node) {
		if r.attempt != attempt || (r.phase != phReserving && r.phase != phLookup && r.phase != phReleasing && r.phase != phRecording) {
			return
		}
		w.log(recTimeout, node, 0, r.id, int64(attempt), r.phase.String())
		w.gatewayUnknown(r)
		return
	}
	if r.opAttempt != attempt || (r.opPhase != opStarting && r.opPhase != opSettling) || !w.execs[r.exec].up {
		return
	}
	w.log(recTimeout, node, 0, r.id, int64(attempt), r.opPhase.String())
	w.executorUnknown(r)
}

// gatewayUnknown handles a lost or failed answer: a reserve whose outcome
// is unknown enters RESERVATION_UNKNOWN and is resolved by looking the
// same id up, never by a new id.
func (w *world) gatewayUnknown(r *request) {
	switch r.phase {
	case phReserving:
		if r.unknownSince < 0 {
			r.unknownSince = w.now
			w.log(recUnknown, w.gatewayNode(r.gw), ledger.KindReserve, r.id, 0, "RESERVATION_UNKNOWN")
		}
		w.sendLookup(r)
	case phLookup:
		w.sendLookup(r)
	case phReleasing:
		w.sendRelease(r)
	case phRecording:
		w.recordUnknown(r)
	}
}

func (w *world) resolveUnknown(r *request) {
	if r.unknownSince >= 0 {
		d := w.now - r.unknownSince
		w.resUnknown = append(w.resUnknown, d)
		w.log(recResolved, w.gatewayNode(r.gw), ledger.KindReserve, r.id, d, "RESERVATION_UNKNOWN")
		r.unknownSince = -1
	}
}

func (w *world) gatewayReceive(m *message) {
	if m.cmd.Kind == ledger.KindShardIssue || m.cmd.Kind == ledger.KindShardReconcile {
		w.shardAnswer(m)
		return
	}
	r := w.requests[m.owner]
	node := w.gatewayNode(r.gw)
	w.log(recDeliver, node, m.cmd.Kind, m.cmd.ReservationID, int64(m.attempt), msgNames[m.kind])
	if m.kind == msgAnswer {
		w.checkRefundAnswer(r, m)
		w.checkRecordAnswer(r, m)
		if w.fail != nil {
			return
		}
	}
	if m.probe {
		w.probeAnswer(r, m)
		return
	}
	if m.late {
		w.lateRetryAnswer(r, m)
		return
	}
	if m.attempt != r.attempt || r.phase == phDone {
		w.log(recStale, node, m.cmd.Kind, r.id, int64(m.attempt), "")
		return
	}
	switch m.kind {
	case msgUnavailable:
		w.gatewayUnknown(r)
	case msgLookupAnswer:
		if r.phase != phLookup {
			return
		}
		if !m.found {
			// Not committed (yet): send the same reserve again. A copy still
			// in flight turns into a replay of whichever lands first.
			w.sendReserve(r, w.between(netMin, netMax))
			return
		}
		w.resolveUnknown(r)
		w.adoptReceipt(r, &m.res.Reservation, "lookup")
	case msgAnswer:
		switch r.phase {
		case phReserving:
			w.reserveAnswer(r, m.res)
		case phReleasing:
			w.releaseAnswer(r, m.res)
		case phRecording:
			w.recordAnswer(r, m.res)
		}
	}
}

func (w *world) reserveAnswer(r *request, res *ledger.Result) {
	switch {
	case res.Err == nil:
		w.resolveUnknown(r)
		w.adoptReceipt(r, &res.Reservation, "reserve")
	case res.Rejected():
		w.resolveUnknown(r)
		r.tries++
		if errors.Is(res.Err, ledger.ErrReservationTooLarge) || r.tries >= 4 {
			w.done(r, outRejected)
			return
		}
		wait := min(max(int64(res.RetryAfter), int64(time.Second)), int64(20*time.Second))
		r.phase = phBackoff
		w.after(wait+w.between(0, int64(time.Second)), evRetry, 0, r.idx, r.attempt)
	case errors.Is(res.Err, ledger.ErrNoPolicy):
		w.resolveUnknown(r)
		w.done(r, outNoPolicy)
	case errors.Is(res.Err, ledger.ErrInvalidCommand) && w.dropsUnitsOf(res.Generation, &r.units):
		// A generation that dropped a unit r holds was published after
		// the gateway shaped the request: it refuses the unit, and the
		// gateway gives the request up (a client would build a new one).
		// The answer names that generation: by the time a delayed answer
		// arrives, a rollback may have made one with the unit decide.
		w.resolveUnknown(r)
		w.done(r, outRejected)
	default:
		w.violate(GateProtocol, fmt.Sprintf("reserve %s answered %v", r.id, res.Err))
	}
}

func (w *world) retryReserve(idx, attempt int32) {
	r := w.requests[idx]
	if r.phase != phBackoff || r.attempt != attempt {
		return
	}
	w.sendReserve(r, w.between(netMin, netMax))
}

// adoptReceipt continues from a reservation receipt (a reserve answer or a
// lookup). The receipt must be this request's: same id, digest and units.
func (w *world) adoptReceipt(r *request, resv *ledger.Reservation, via string) {
	if resv.Retired && resv.ID == r.id && resv.RequestDigest == r.digest {
		// Retention removed it (the tombstone keeps no amounts): it
		// finished while the gateway did not know, which only expiry does.
		if resv.State == ledger.StateExpired {
			w.done(r, outExpired)
			return
		}
		w.violate(GateProtocol, fmt.Sprintf("%s of %s found it %s and removed by retention before the gateway dispatched or released it", via, r.id, resv.State))
		return
	}
	if resv.ID != r.id || resv.RequestDigest != r.digest || resv.Reserved != r.units {
		w.violate(GateProtocol, fmt.Sprintf("%s of %s returned the receipt of %s (digest %s, units %v), not the request's (digest %s, units %v)",
			via, r.id, resv.ID, resv.RequestDigest, resv.Reserved, r.digest, r.units))
		return
	}
	switch resv.State {
	case ledger.StateReserved:
		r.expiresAt = int64(resv.ExpiresAt.Sub(epoch0))
		if w.f.fire(SiteDigestReuse) {
			w.probe(r)
		}
		if w.chance(0.15) {
			w.sendRelease(r)
			return
		}
		r.phase = phDispatched
		r.exec = w.rng.IntN(w.shape.executors)
		if w.backlogOn {
			// Executor 0 runs the backlog burst alone.
			r.exec = 1 + w.rng.IntN(w.shape.executors-1)
			if r.backlog {
				r.exec = 0
			}
		}
		w.after(w.between(netMin, jobDelayMax), evJob, 0, r.idx, 0)
	case ledger.StateExpiring, ledger.StateExpired:
		w.done(r, outExpired)
	default:
		w.violate(GateProtocol, fmt.Sprintf("%s of %s found it %s before the gateway dispatched or released it", via, r.id, resv.State))
	}
}

// probe sends the request's reservation id with another digest, as a
// buggy client reusing an idempotency key would; the ledger must refuse it.
func (w *world) probe(r *request) {
	cmd := w.reserveCommand(r)
	cmd.RequestDigest = r.digest + "-other"
	w.send(&message{kind: msgCommand, from: w.gatewayNode(r.gw), to: ledgerNodeID, owner: r.idx, probe: true, cmd: cmd})
}

func (w *world) probeAnswer(r *request, m *message) {
	if m.kind != msgAnswer {
		return
	}
	if !errors.Is(m.res.Err, ledger.ErrDigestMismatch) {
		w.violate(GateSecondReservation, fmt.Sprintf("reservation id %s reused with another digest answered %v (replayed %v), not %v",
			r.id, m.res.Err, m.res.Replayed, ledger.ErrDigestMismatch))
	}
}

func (w *world) releaseAnswer(r *request, res *ledger.Result) {
	switch {
	case res.Err == nil:
		w.done(r, outReleased)
	case errors.Is(res.Err, ledger.ErrReservationExpired):
		w.done(r, outExpired)
	default:
		w.violate(GateProtocol, fmt.Sprintf("release of unstarted %s answered %v", r.id, res.Err))
	}
}

// checkRefundAnswer checks every refunding answer, stale or not: a replay
// refunds nothing, the first refund is exactly what the transition gives
// back, and no reservation is refunded twice.
func (w *world) checkRefundAnswer(r *request, m *message) {
	res := m.res
	if res.Err != nil || (m.cmd.Kind != ledger.KindSettle && m.cmd.Kind != ledger.KindRelease) {
		return
	}
	if res.Replayed {
		if res.Refunded != (ledger.Amounts{}) {
			w.violate(GateDuplicateRefund, fmt.Sprintf("replayed %s of %s refunded %v again", m.cmd.Kind, r.id, res.Refunded))
		}
		return
	}
	if r.refundAnswer == m.answerID {
		return // a network duplicate of the same answer
	}
	if r.refundAnswer != 0 {
		w.violate(GateDuplicateRefund, fmt.Sprintf("%s of %s refunded %v a second time", m.cmd.Kind, r.id, res.Refunded))
		return
	}
	r.refundAnswer = m.answerID
	want := r.units
	if m.cmd.Kind == ledger.KindSettle {
		for d := range want {
			want[d] = max(0, r.units[d]-m.cmd.Units[d])
		}
	}
	if res.Refunded != want {
		w.violate(GateDuplicateRefund, fmt.Sprintf("%s of %s refunded %v, want %v", m.cmd.Kind, r.id, res.Refunded, want))
	}
}

func (w *world) done(r *request, out outcome) {
	r.phase = phDone
	r.outcome = out
	w.log(recDone, w.gatewayNode(r.gw), 0, r.id, 0, outcomeNames[out])
	w.retryAfterRetention(r)
}
