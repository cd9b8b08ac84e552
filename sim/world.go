package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// epoch0 is simulated time zero. Simulated time is kept as nanoseconds
// since epoch0; ledger commands get epoch0 plus that.
var epoch0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

// Simulated latencies and timeouts.
const (
	netMin        = int64(time.Millisecond)
	netMax        = int64(20 * time.Millisecond)
	netDelayMin   = int64(time.Second)
	netDelayMax   = int64(8 * time.Second)
	batchWindow   = int64(2 * time.Millisecond)
	rpcTimeout    = int64(3 * time.Second)
	workerEvery   = int64(time.Second)
	epochEvery    = int64(30 * time.Second)
	chaosEvery    = int64(5 * time.Second)
	jobDelayMax   = int64(50 * time.Millisecond)
	restartMin    = int64(time.Second)
	restartMax    = int64(20 * time.Second)
	execRestartLo = int64(5 * time.Second)
	execRestartHi = int64(60 * time.Second)
	partitionMin  = int64(5 * time.Second)
	partitionMax  = int64(90 * time.Second)
)

type evKind uint8

const (
	evDeliver evKind = iota + 1
	evBatch
	evLedgerRestart
	evWorker
	evChaos
	evArrival
	evTimer
	evRetry
	evJob
	evStart
	evOpDone
	evExecRestart
	evPartitionEnd
	evHeal
	evDeadline
	evShard
	evRaceWorker
	evLateRetry
	evSync
	evCompaction
	evRecordWork
)

// event is one scheduled happening. Events run in (at, seq) order: seq is
// the order of scheduling, so equal times keep a deterministic order.
type event struct {
	at   int64
	seq  uint64
	kind evKind
	a, b int32
	c    int32
	msg  *message
}

type msgKind uint8

const (
	msgCommand msgKind = iota + 1
	msgLookup
	msgAnswer
	msgLookupAnswer
	msgUnavailable
)

// message travels between an actor and the ledger through the simulated
// network. owner is the index of the request it is about, attempt the
// sender's attempt number (answers of older attempts are stale).
type message struct {
	kind    msgKind
	from    int32
	to      int32
	owner   int32
	attempt int32
	probe   bool
	late    bool // a retention_retry reserve, or a resubmission for a removed shard
	// answerID numbers the ledger's answers; a network duplicate of an
	// answer carries the same number.
	answerID int64
	cmd      ledger.Command
	// res is the answer (nil on requests and on "unavailable").
	res   *ledger.Result
	found bool
	// sub numbers a shard reconciliation's submission (1 the first) on the
	// gateway's side, so that the answer to a copy is matched to it.
	sub int32
}

// world is one interleaving: every actor, the ledger, the network and the
// clock, driven by one goroutine from one seeded random source.
type world struct {
	cfg  *Config
	seed uint64
	rng  *rand.Rand
	f    faults
	ctx  context.Context

	now    int64
	seq    uint64
	queue  []event
	events int64

	shape    shape
	ledger   ledgerNode
	gateways []gateway
	execs    []executor
	requests []*request
	tenants  []tenant
	op       operator
	shards   shardSim
	fair     fairness

	// ledgerStore is the store the engine runs on (the recording store
	// over the memstore, or over a test's wrapper around it).
	ledgerStore store.Store
	hooks       hooks

	// cut[node] is true while node cannot reach the ledger.
	cut      []bool
	inflight int

	chk checker
	tr  tracer

	// backlogOn: this interleaving has a backlog burst (executor 0 runs
	// only its requests).
	backlogOn bool
	// onSQLite: this interleaving's ledger runs on the real SQLite store.
	onSQLite bool
	// pipelined: this interleaving's ledger commits with pipelined
	// durability (Config.PipelinedShare, pipeline.go).
	pipelined bool
	// retention is the interleaving's retention worker (off in some).
	retention retentionSim
	// compaction is the interleaving's compaction worker (off in some).
	compaction compactionSim

	healed   bool
	finished bool
	fail     *Violation

	recordStats RecordStats

	resUnknown   []int64 // RESERVATION_UNKNOWN durations, simulated ns
	usageUnknown []int64 // USAGE_UNKNOWN durations
}

// shape is what the seed drew for this interleaving.
type shape struct {
	gateways, executors, tenants, dims, requests int
}

func (s shape) String() string {
	return fmt.Sprintf("gateways=%d executors=%d tenants=%d dimensions=%d requests=%d",
		s.gateways, s.executors, s.tenants, s.dims, s.requests)
}

// node ids: 0 is the ledger process (with its workers and the operator's
// admin calls), then gateways, then executors.
const ledgerNodeID = 0

func (w *world) gatewayNode(i int) int32  { return int32(1 + i) }
func (w *world) executorNode(i int) int32 { return int32(1 + w.shape.gateways + i) }
func (w *world) isGateway(node int32) bool {
	return node >= 1 && int(node) <= w.shape.gateways
}

func (w *world) time() time.Time { return epoch0.Add(time.Duration(w.now)) }

// between returns a uniform int64 in [lo, hi].
func (w *world) between(lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	return lo + w.rng.Int64N(hi-lo+1)
}

func (w *world) chance(p float64) bool { return w.rng.Float64() < p }

func (w *world) schedule(e event) {
	w.seq++
	e.seq = w.seq
	w.queue = append(w.queue, e)
	// sift up
	i := len(w.queue) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !eventLess(&w.queue[i], &w.queue[parent]) {
			break
		}
		w.queue[i], w.queue[parent] = w.queue[parent], w.queue[i]
		i = parent
	}
}

func eventLess(a, b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (w *world) pop() event {
	q := w.queue
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = event{}
	q = q[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(q) {
			break
		}
		small := l
		if r := l + 1; r < len(q) && eventLess(&q[r], &q[l]) {
			small = r
		}
		if !eventLess(&q[small], &q[i]) {
			break
		}
		q[i], q[small] = q[small], q[i]
		i = small
	}
	w.queue = q
	return top
}

func (w *world) after(d int64, kind evKind, a, b, c int32) {
	w.schedule(event{at: w.now + d, kind: kind, a: a, b: b, c: c})
}

func (w *world) log(what recKind, node int32, kind ledger.Kind, id string, n int64, note string) {
	w.tr.add(rec{at: w.now, what: what, node: node, kind: kind, id: id, n: n, note: note})
}

// send puts a message on the simulated network. Messages between an actor
// and the ledger may be dropped, duplicated, delayed (and so reordered)
// and are lost while either end is partitioned.
func (w *world) send(m *message) {
	w.sendWithDelay(m, w.between(netMin, netMax))
}

func (w *world) sendWithDelay(m *message, delay int64) {
	w.log(recSend, m.from, m.cmd.Kind, m.cmd.ReservationID, int64(m.attempt), msgNames[m.kind])
	if w.partitioned(m) {
		w.log(recPartitionDrop, m.from, m.cmd.Kind, m.cmd.ReservationID, 0, "")
		return
	}
	if w.f.fire(SiteNetDrop) {
		w.log(recDrop, m.from, m.cmd.Kind, m.cmd.ReservationID, 0, "")
		return
	}
	if w.f.fire(SiteNetDelay) {
		delay += w.between(netDelayMin, netDelayMax)
		w.log(recDelay, m.from, m.cmd.Kind, m.cmd.ReservationID, delay, "")
	}
	w.inflight++
	w.schedule(event{at: w.now + delay, kind: evDeliver, msg: m})
	if w.f.fire(SiteNetDuplicate) {
		dup := *m
		w.log(recDuplicate, m.from, m.cmd.Kind, m.cmd.ReservationID, 0, "")
		w.inflight++
		w.schedule(event{at: w.now + w.between(netMin, netDelayMax), kind: evDeliver, msg: &dup})
	}
}

var msgNames = [...]string{
	msgCommand:      "command",
	msgLookup:       "lookup",
	msgAnswer:       "answer",
	msgLookupAnswer: "lookup-answer",
	msgUnavailable:  "unavailable",
}

func (w *world) partitioned(m *message) bool {
	if m.from == ledgerNodeID {
		return w.cut[m.to]
	}
	return w.cut[m.from]
}

func (w *world) deliver(m *message) {
	w.inflight--
	if w.partitioned(m) {
		w.log(recPartitionDrop, m.to, m.cmd.Kind, m.cmd.ReservationID, 0, "in flight")
		return
	}
	switch {
	case m.to == ledgerNodeID:
		w.ledgerReceive(m)
	case w.isGateway(m.to):
		w.gatewayReceive(m)
	default:
		w.executorReceive(m)
	}
}

// run drives the interleaving until everything converged after the faults
// healed, a violation stopped it, or nothing is left to happen.
func (w *world) run() {
	for len(w.queue) > 0 && !w.finished && w.fail == nil {
		e := w.pop()
		w.now = e.at
		w.events++
		switch e.kind {
		case evDeliver:
			w.deliver(e.msg)
		case evBatch:
			w.ledgerBatch()
		case evLedgerRestart:
			w.ledgerRestart()
		case evWorker:
			w.workerTick(e.a != 0)
		case evChaos:
			w.chaosTick()
		case evArrival:
			w.arrive(e.a)
		case evTimer:
			w.timer(e.a, e.b, e.c)
		case evRetry:
			w.retryReserve(e.b, e.c)
		case evJob:
			w.job(e.b)
		case evStart:
			w.delayedStart(e.b, e.c)
		case evOpDone:
			w.opDone(e.b)
		case evExecRestart:
			w.executorRestart(int(e.a))
		case evPartitionEnd:
			w.partitionEnd(e.a, e.b)
		case evHeal:
			w.heal()
		case evDeadline:
			w.deadline()
		case evShard:
			w.shardEvent(e.a, e.b, e.c)
		case evRaceWorker:
			w.raceWorker(e.a, e.b)
		case evSync:
			w.ledgerSynced(e.a)
		case evLateRetry:
			w.lateRetry(e.b)
		case evCompaction:
			w.compactionStep(e.a)
		case evRecordWork:
			w.recordWorkDone(e.b)
		}
	}
	if w.fail == nil && !w.finished {
		w.violate(GateLiveness, "the simulation ran out of events before converging")
	}
}

func (w *world) heal() {
	w.healed = true
	w.f.healed = true
	for i := range w.cut {
		w.cut[i] = false
	}
	w.log(recHeal, ledgerNodeID, 0, "", 0, "faults healed")
}

// quiescent reports whether everything converged: every request reached a
// terminal outcome, every executor's operation settled, the ledger holds
// nothing reserved and owes no debt, no message is in flight, and every
// process is up.
func (w *world) quiescent() bool {
	if !w.healed || w.inflight > 0 || !w.ledger.up || w.now <= w.retention.retriesUntil {
		return false
	}
	if w.ledger.syncing || len(w.ledger.awaiting) > 0 || len(w.ledger.st.unsynced) > 0 {
		return false // committed batches wait for their fsync
	}
	for _, r := range w.requests {
		if r.phase != phDone {
			return false
		}
	}
	for i := range w.execs {
		if !w.execs[i].up {
			return false
		}
	}
	if !w.shards.quiescent(w) {
		return false
	}
	return w.chk.settledDown()
}

func (w *world) deadline() {
	if w.finished || w.fail != nil {
		return
	}
	// Converged at this very instant, before the worker tick that would
	// have noticed: that took the deadline, not more.
	if w.quiescent() {
		w.finish()
		return
	}
	var open []string
	for _, r := range w.requests {
		if r.phase != phDone {
			open = append(open, fmt.Sprintf("%s in %s (op %s)", r.id, r.phase, r.opPhase))
			if len(open) == 5 {
				break
			}
		}
	}
	w.violate(GateLiveness, fmt.Sprintf("not converged %s after healing: requests open: [%s]; shards open: [%s]; %s",
		time.Duration(w.now-int64(w.cfg.HealAt)), strings.Join(open, ", "), w.shards.openSummary(), w.chk.openSummary()))
}
