package server

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/store"
	"github.com/prometheus/client_golang/prometheus"
)

// leaderReporter is the optional part of Ledger that reports the worker
// lease (*engine.Engine has it).
type leaderReporter interface {
	Leader() engine.LeaderStatus
}

// Status is what GET /statusz answers (and `capledger status` prints):
// whether the replica is ready, whether it runs the maintenance workers,
// and the engine's counters.
type Status struct {
	Ready      bool   `json:"ready"`
	ReadyError string `json:"readyError,omitempty"`
	Workers    struct {
		// Leader: this replica holds the worker lease and runs the
		// workers; the other replicas of the store wait to take over.
		Leader       bool       `json:"leader"`
		Self         string     `json:"self"`
		Holder       string     `json:"holder,omitempty"`
		Fence        int64      `json:"fence"`
		LeaseExpires *time.Time `json:"leaseExpires,omitempty"`
		LeaderSince  *time.Time `json:"leaderSince,omitempty"`
		LeaseError   string     `json:"leaseError,omitempty"`
		// Health: each maintenance worker this replica is configured
		// with (expiry, epochs, and retention, compaction, resolver when
		// on), failing while a failure it logged has no recovery line
		// yet (docs/OPERATIONS.md, "Worker leader"); false on a replica
		// that does not run the workers.
		Health map[string]WorkerHealthStatus `json:"health,omitempty"`
	} `json:"workers"`
	Commands       uint64 `json:"commands"`
	Batches        uint64 `json:"batches"`
	Conflicts      uint64 `json:"conflicts"`
	Failures       uint64 `json:"failures"`
	WorkerCommands uint64 `json:"workerCommands"`
	// Compaction: the statement checkpoints this replica cut and the
	// journal rows it deleted (docs/OPERATIONS.md, "Retention and
	// compaction"); absent when compaction is off (serve --compaction 0).
	Compaction *CompactionStatus `json:"compaction,omitempty"`
	// Retention: the retention worker's passes on this replica; a
	// lastPassSeconds or passRunningSeconds near the retention interval
	// or above it means the worker does not keep up (docs/OPERATIONS.md);
	// absent when retention is off (serve --retention 0).
	Retention *RetentionStatus `json:"retention,omitempty"`
	// SubjectIndex: the SQLite store's subject index, written behind the
	// commits; while catchingUp the console's listings of a subject
	// answer 503 (docs/OPERATIONS.md); absent on other stores.
	SubjectIndex *SubjectIndexStatus `json:"subjectIndex,omitempty"`
}

// WorkerHealthStatus is one maintenance worker's part of Status.
type WorkerHealthStatus struct {
	// Failing since FailingSince, when the first of its failures that
	// have no recovery line in the log yet was logged.
	Failing      bool       `json:"failing"`
	FailingSince *time.Time `json:"failingSince,omitempty"`
}

// workerHealthReporter is the Ledger capability behind
// Status.Workers.Health.
type workerHealthReporter interface{ WorkersHealth() []engine.WorkerHealth }

// SubjectIndexStatus is the store's subject index part of Status
// (store.SubjectIndexStatus).
type SubjectIndexStatus struct {
	CatchingUp bool   `json:"catchingUp"`
	CatchUps   uint64 `json:"catchUps"`
	Pending    int    `json:"pending"`
	LastError  string `json:"lastError,omitempty"`
}

// subjectIndexOf returns the store's subject index reporter, if the
// console store has one (SQLite).
func subjectIndexOf(cs store.ConsoleStore) (store.SubjectIndexReporter, bool) {
	r, ok := cs.(store.SubjectIndexReporter)
	return r, ok
}

// retentionRemovedHelp is the help of capledger_retention_removed_total,
// one for every kind.
const retentionRemovedHelp = "Finished reservations (kind=reservation), tombstones (kind=tombstone), quiet gateways' shard fence rows (kind=shard_fence), " +
	"settled emergency shards (kind=shard) and epoch statements past --statement-retention (kind=statement) retention removed."

// RetentionStatus is the retention worker's part of Status.
type RetentionStatus struct {
	Passes    uint64 `json:"passes"`
	Retired   uint64 `json:"retired"`
	Forgotten uint64 `json:"tombstonesForgotten"`
	// FencesFolded: shard fence rows of quiet gateways folded into the
	// store's fence floor.
	FencesFolded uint64 `json:"shardFencesFolded"`
	// StatementsRemoved: epoch statements removed past serve
	// --statement-retention.
	StatementsRemoved uint64 `json:"statementsRemoved"`
	// ShardsRemoved: settled emergency shards removed with their meta
	// rows, folded into retained shard totals.
	ShardsRemoved uint64 `json:"shardsRemoved"`
	Failed        uint64 `json:"failed"`
	// LastPassAt and LastPassSeconds: the start and length of the last
	// finished pass.
	LastPassAt      *time.Time `json:"lastPassAt,omitempty"`
	LastPassSeconds float64    `json:"lastPassSeconds"`
	// PassRunningSince and PassRunningSeconds: the start of the pass
	// under way and how long it has run so far (absent when none runs).
	PassRunningSince   *time.Time `json:"passRunningSince,omitempty"`
	PassRunningSeconds float64    `json:"passRunningSeconds,omitempty"`
}

// retentionReporter is the Ledger capability behind Status.Retention.
type retentionReporter interface{ RetentionStats() engine.RetentionStats }

// CompactionStatus is the compaction worker's part of Status.
type CompactionStatus struct {
	Checkpoints uint64     `json:"checkpoints"`
	Deleted     uint64     `json:"journalRowsDeleted"`
	Refused     uint64     `json:"refused"`
	LastSeq     int64      `json:"lastCheckpoint"`
	LastCutAt   *time.Time `json:"lastCutAt,omitempty"`
	// Refusing: the last audit refused the cut (discrepancies), since
	// RefusingSince; the next audit is due at NextAuditAt, or at the
	// next pass after a clean audit is recorded (docs/OPERATIONS.md).
	Refusing      bool       `json:"refusing"`
	RefusingSince *time.Time `json:"refusingSince,omitempty"`
	NextAuditAt   *time.Time `json:"nextAuditAt,omitempty"`
}

// compactionReporter is the Ledger capability behind Status.Compaction.
type compactionReporter interface{ CompactionStats() engine.CompactionStats }

// workerLeader reports whether this replica runs the workers.
func (s *Server) workerLeader() bool {
	lr, ok := s.ledger.(leaderReporter)
	return ok && lr.Leader().Leader
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// status assembles the replica's Status. Ready is /readyz's answer (the
// engine's last store access, a read of the store now, the ReadyCheck), so
// that a replica a load balancer takes out of rotation never calls itself
// ready here.
func (s *Server) status(ctx context.Context) Status {
	var st Status
	if _, err := s.readiness(ctx); err != nil {
		st.ReadyError = err.Error()
	} else {
		st.Ready = true
	}
	if lr, ok := s.ledger.(leaderReporter); ok {
		l := lr.Leader()
		st.Workers.Leader, st.Workers.Self, st.Workers.Holder, st.Workers.Fence = l.Leader, l.Self, l.Holder, l.Fence
		st.Workers.LeaseExpires, st.Workers.LeaderSince, st.Workers.LeaseError = timePtr(l.Expires), timePtr(l.Since), l.Err
	}
	if hr, ok := s.ledger.(workerHealthReporter); ok {
		st.Workers.Health = map[string]WorkerHealthStatus{}
		for _, h := range hr.WorkersHealth() {
			st.Workers.Health[h.Name] = WorkerHealthStatus{Failing: !h.FailingSince.IsZero(), FailingSince: timePtr(h.FailingSince)}
		}
	}
	if cr, ok := s.ledger.(compactionReporter); ok && cr.CompactionStats().On {
		c := cr.CompactionStats()
		st.Compaction = &CompactionStatus{Checkpoints: c.Checkpoints, Deleted: c.Deleted, Refused: c.Refused,
			LastSeq: c.LastSeq, LastCutAt: timePtr(c.LastCutAt),
			Refusing: !c.RefusingSince.IsZero(), RefusingSince: timePtr(c.RefusingSince), NextAuditAt: timePtr(c.NextAuditAt)}
	}
	if rr, ok := s.ledger.(retentionReporter); ok {
		if r := rr.RetentionStats(); r.On {
			st.Retention = &RetentionStatus{Passes: r.Passes, Retired: r.Retired, Forgotten: r.Forgotten, FencesFolded: r.FencesFolded,
				StatementsRemoved: r.StatementsRemoved, ShardsRemoved: r.ShardsRemoved, Failed: r.Failed,
				LastPassAt: timePtr(r.LastPassAt), LastPassSeconds: r.LastPass.Seconds(), PassRunningSince: timePtr(r.RunningSince)}
			if !r.RunningSince.IsZero() {
				st.Retention.PassRunningSeconds = max(time.Since(r.RunningSince).Seconds(), 1e-9)
			}
		}
	}
	if r, ok := subjectIndexOf(s.console.store); ok {
		x := r.SubjectIndexStatus()
		st.SubjectIndex = &SubjectIndexStatus{CatchingUp: x.CatchingUp, CatchUps: x.CatchUps, Pending: x.Pending, LastError: x.LastError}
	}
	stats := s.ledger.Stats()
	st.Commands, st.Batches, st.Conflicts, st.Failures, st.WorkerCommands =
		stats.Commands, stats.Batches, stats.Conflicts, stats.Failures, stats.WorkerCmds
	return st
}

// statusz answers the replica's Status as JSON (200 whether or not it is
// ready: its ready field is /readyz's answer).
func (s *Server) statusz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.status(r.Context()))
}

// registerLeader exports the worker lease: capledger_worker_leader is 1 on
// the replica that runs the workers, 0 on the others (sum it over the
// replicas of one store: it should be 1), and capledger_worker_lease_fence
// counts the leader changes the store has seen. capledger_worker_failing
// is 1 per worker (and the lease) while it is failing
// (Status.Workers.Health).
func (m *Metrics) registerLeader(l Ledger) {
	if hr, ok := l.(workerHealthReporter); ok {
		for _, h := range hr.WorkersHealth() {
			name := h.Name
			m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_worker_failing",
				Help:        "1 while the maintenance worker (label worker; lease: the worker lease's renewals, on every replica) is failing: a failure it logged has no recovery line yet; 0 when it works or this replica does not run it.",
				ConstLabels: prometheus.Labels{"worker": name}},
				func() float64 {
					for _, h := range hr.WorkersHealth() {
						if h.Name == name && !h.FailingSince.IsZero() {
							return 1
						}
					}
					return 0
				}))
		}
	}
	lr, ok := l.(leaderReporter)
	if !ok {
		return
	}
	m.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_worker_leader",
			Help: "1 while this replica holds the worker lease and runs the maintenance workers, else 0."},
			func() float64 {
				if lr.Leader().Leader {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_worker_lease_fence",
			Help: "The worker lease's fence as last read: it grows by one with every change of leader."},
			func() float64 { return float64(lr.Leader().Fence) }),
	)
}

// registerMaintenance exports the retention and compaction workers'
// counters for alerting (the same figures /statusz shows), only for the
// workers the engine runs: capledger_retention_pass_running_seconds
// above the retention interval means retention is behind while the long
// pass that shows it still runs.
func (m *Metrics) registerMaintenance(l Ledger) {
	if rr, ok := l.(retentionReporter); ok && rr.RetentionStats().On {
		counter := func(name, help string, labels prometheus.Labels, f func(engine.RetentionStats) uint64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
				func() float64 { return float64(f(rr.RetentionStats())) })
		}
		m.registry.MustRegister(
			counter("capledger_retention_passes_total", "Retention passes finished on this replica.", nil,
				func(s engine.RetentionStats) uint64 { return s.Passes }),
			counter("capledger_retention_removed_total", retentionRemovedHelp,
				prometheus.Labels{"kind": "reservation"}, func(s engine.RetentionStats) uint64 { return s.Retired }),
			counter("capledger_retention_removed_total", retentionRemovedHelp,
				prometheus.Labels{"kind": "tombstone"}, func(s engine.RetentionStats) uint64 { return s.Forgotten }),
			counter("capledger_retention_removed_total", retentionRemovedHelp,
				prometheus.Labels{"kind": "shard_fence"}, func(s engine.RetentionStats) uint64 { return s.FencesFolded }),
			counter("capledger_retention_removed_total", retentionRemovedHelp,
				prometheus.Labels{"kind": "shard"}, func(s engine.RetentionStats) uint64 { return s.ShardsRemoved }),
			counter("capledger_retention_removed_total", retentionRemovedHelp,
				prometheus.Labels{"kind": "statement"}, func(s engine.RetentionStats) uint64 { return s.StatementsRemoved }),
			counter("capledger_retention_failed_total", "Retention commands the ledger refused.", nil,
				func(s engine.RetentionStats) uint64 { return s.Failed }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_retention_last_pass_seconds",
				Help: "Length of the last finished retention pass."},
				func() float64 { return rr.RetentionStats().LastPass.Seconds() }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_retention_pass_running_seconds",
				Help: "How long the retention pass under way has run; 0 when none runs."},
				func() float64 {
					if t := rr.RetentionStats().RunningSince; !t.IsZero() {
						return time.Since(t).Seconds()
					}
					return 0
				}),
		)
	}
	if cr, ok := l.(compactionReporter); ok && cr.CompactionStats().On {
		counter := func(name, help string, f func(engine.CompactionStats) uint64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
				func() float64 { return float64(f(cr.CompactionStats())) })
		}
		m.registry.MustRegister(
			counter("capledger_compaction_checkpoints_total", "Statement checkpoints this replica cut.",
				func(s engine.CompactionStats) uint64 { return s.Checkpoints }),
			counter("capledger_compaction_journal_rows_deleted_total", "Journal rows deleted behind checkpoints.",
				func(s engine.CompactionStats) uint64 { return s.Deleted }),
			counter("capledger_compaction_refused_total", "Checkpoint cuts refused because their audit found discrepancies, one per refused audit.",
				func(s engine.CompactionStats) uint64 { return s.Refused }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_compaction_refusing",
				Help: "1 on the worker lease holder while its last compaction audit refused the cut (discrepancies; nothing is deleted), else 0."},
				func() float64 {
					if cr.CompactionStats().RefusingSince.IsZero() {
						return 0
					}
					return 1
				}),
		)
	}
}

// registerSubjectIndex exports the store's subject index (SQLite) for
// alerting, the figures /statusz shows: capledger_subject_index_catching_up
// is 1 while the console's listings of a subject answer 503.
func (m *Metrics) registerSubjectIndex(cs store.ConsoleStore) {
	r, ok := subjectIndexOf(cs)
	if !ok {
		return
	}
	m.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_subject_index_catching_up",
			Help: "1 while the store's subject index catches up from the journal (the console's subject listings answer 503), else 0."},
			func() float64 {
				if r.SubjectIndexStatus().CatchingUp {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "capledger_subject_index_catch_ups_total",
			Help: "Catch-ups of the store's subject index from the journal begun since the store was opened."},
			func() float64 { return float64(r.SubjectIndexStatus().CatchUps) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "capledger_subject_index_pending",
			Help: "Committed subject index entries waiting to be written to the store's index."},
			func() float64 { return float64(r.SubjectIndexStatus().Pending) }),
	)
}
