package sim

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
)

// recKind names what a trace record says happened.
type recKind uint8

const (
	recSend recKind = iota + 1
	recDeliver
	recDrop
	recPartitionDrop
	recDownDrop
	recDuplicate
	recDelay
	recStale
	recTimeout
	recAnswer
	recCommit
	recCommitFailed
	recConflictRetry
	recAckLost
	recCrash
	recRestart
	recPartition
	recHeal
	recArrive
	recUnknown
	recResolved
	recDone
	recJob
	recOpDone
	recExecCrash
	recExecRestart
	recPublish
	recRollback
	recWorker
	recViolation
	recShard
	recSync
	recUnsyncedLost
	recCompaction
)

var recNames = [...]string{
	recSend:          "send",
	recDeliver:       "deliver",
	recDrop:          "drop",
	recPartitionDrop: "partition-drop",
	recDownDrop:      "down-drop",
	recDuplicate:     "duplicate",
	recDelay:         "delay",
	recStale:         "stale",
	recTimeout:       "timeout",
	recAnswer:        "answer",
	recCommit:        "commit",
	recCommitFailed:  "commit-failed",
	recConflictRetry: "conflict-retry",
	recAckLost:       "ack-lost",
	recCrash:         "crash",
	recRestart:       "restart",
	recPartition:     "partition",
	recHeal:          "heal",
	recArrive:        "arrive",
	recUnknown:       "unknown",
	recResolved:      "resolved",
	recDone:          "done",
	recJob:           "job",
	recOpDone:        "op-done",
	recExecCrash:     "exec-crash",
	recExecRestart:   "exec-restart",
	recPublish:       "publish",
	recRollback:      "rollback",
	recWorker:        "worker",
	recViolation:     "VIOLATION",
	recShard:         "shard",
	recSync:          "fsync",
	recUnsyncedLost:  "unsynced-lost",
	recCompaction:    "compaction",
}

// rec is one trace record. It is kept unformatted (formatting every event
// would cost more than simulating it); String formats it for a report.
type rec struct {
	at   int64
	what recKind
	node int32
	kind ledger.Kind
	n    int64
	id   string
	note string
}

// tracer hashes every record into the interleaving's trace hash (FNV-1a
// style) and keeps the last few for a violation report.
type tracer struct {
	hash  uint64
	ring  []rec
	next  int
	count int64
	out   io.Writer
	names []string // node names by id
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func newTracer(last int, out io.Writer) tracer {
	return tracer{hash: fnvOffset, ring: make([]rec, last), out: out}
}

// mixInt folds a whole word in at once (FNV-1a over words, with a shift
// so high bits reach low ones); strings go byte by byte.
func (t *tracer) mixInt(v int64) {
	h := (t.hash ^ uint64(v)) * fnvPrime
	t.hash = h ^ h>>29
}

func (t *tracer) mixString(s string) {
	h := t.hash
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	h ^= 0xff
	h *= fnvPrime
	t.hash = h
}

func (t *tracer) add(r rec) {
	t.count++
	t.mixInt(r.at)
	t.mixInt(int64(r.what)<<40 | int64(r.node)<<8 | int64(r.kind))
	t.mixInt(r.n)
	t.mixString(r.id)
	t.mixString(r.note)
	if len(t.ring) > 0 {
		t.ring[t.next] = r
		t.next = (t.next + 1) % len(t.ring)
	}
	if t.out != nil {
		fmt.Fprintln(t.out, t.format(&r))
	}
}

// last returns the kept records, oldest first, formatted.
func (t *tracer) last() []string {
	n := len(t.ring)
	if int64(n) > t.count {
		n = int(t.count)
	}
	out := make([]string, 0, n)
	start := (t.next - n + len(t.ring)) % max(len(t.ring), 1)
	for i := 0; i < n; i++ {
		r := &t.ring[(start+i)%len(t.ring)]
		out = append(out, t.format(r))
	}
	return out
}

func (t *tracer) format(r *rec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%12s ", fmtSimTime(r.at))
	if int(r.node) < len(t.names) {
		fmt.Fprintf(&b, "%-8s ", t.names[r.node])
	} else {
		fmt.Fprintf(&b, "node%-4d ", r.node)
	}
	b.WriteString(recNames[r.what])
	if r.kind != 0 {
		b.WriteString(" ")
		b.WriteString(r.kind.String())
	}
	if r.id != "" {
		b.WriteString(" ")
		b.WriteString(r.id)
	}
	if r.n != 0 {
		fmt.Fprintf(&b, " n=%d", r.n)
	}
	if r.note != "" {
		b.WriteString(" ")
		b.WriteString(r.note)
	}
	return b.String()
}

// fmtSimTime formats simulated nanoseconds since the start as seconds with
// millisecond precision.
func fmtSimTime(at int64) string {
	return fmt.Sprintf("+%d.%03ds", at/int64(time.Second), (at%int64(time.Second))/int64(time.Millisecond))
}
