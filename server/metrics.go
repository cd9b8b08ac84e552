package server

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
)

// Metrics are the server's Prometheus metrics, on a registry of their own
// (so several servers in one test process do not collide).
//
//	capledger_commands_total{kind,outcome}   commands answered, each once, by
//	                                         the outcome its caller saw (ok,
//	                                         replayed, shadow_rejected, a
//	                                         lower-case reason, unavailable)
//	capledger_rejections_total{dimension,reason,rollout}
//	capledger_batch_commands                 commands per committed batch
//	capledger_commit_seconds                 batch commit latency
//	capledger_batch_attempts                 attempts per batch (conflicts)
//	capledger_conflicts_total, capledger_batch_failures_total,
//	capledger_worker_commands_total          from the engine's counters
type Metrics struct {
	registry   *prometheus.Registry
	commands   *prometheus.CounterVec
	rejections *prometheus.CounterVec
	batchSize  prometheus.Histogram
	commitTime prometheus.Histogram
	attempts   prometheus.Histogram

	// counters caches commands_total's counter per kind and outcome, so
	// the request path does not hash label strings and search the vector
	// on each answer. A counter is created on first use, so /metrics shows
	// a series only once it was counted, as with WithLabelValues.
	counters sync.Map // commandLabels -> prometheus.Counter
}

type commandLabels struct {
	kind    ledger.Kind
	outcome string
}

// NewMetrics returns metrics on a fresh registry, with the Go runtime and
// process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capledger_commands_total",
			Help: "Ledger commands answered, by kind and outcome.",
		}, []string{"kind", "outcome"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capledger_rejections_total",
			Help: "Capacity rejections, by limiting dimension, reason and rollout mode (shadow rejections admit).",
		}, []string{"dimension", "reason", "rollout"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "capledger_batch_commands",
			Help:    "Commands per committed store transaction (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		commitTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "capledger_commit_seconds",
			Help:    "Time to commit one batch, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		attempts: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "capledger_batch_attempts",
			Help:    "Attempts per batch; more than one means conflicts were retried.",
			Buckets: []float64{1, 2, 3, 5, 10},
		}),
	}
	m.registry.MustRegister(m.commands, m.rejections, m.batchSize, m.commitTime, m.attempts,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveBatch records one engine batch; pass it as engine.Options.OnBatch.
func (m *Metrics) ObserveBatch(info engine.BatchInfo) {
	m.batchSize.Observe(float64(info.Commands))
	m.commitTime.Observe(info.Duration.Seconds())
	m.attempts.Observe(float64(info.Attempts))
}

// registerEngine exports the engine's cumulative counters.
func (m *Metrics) registerEngine(l Ledger) {
	counter := func(name, help string, value func(engine.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(value(l.Stats())) })
	}
	m.registry.MustRegister(
		counter("capledger_conflicts_total", "Store transactions that lost a race and were retried.",
			func(s engine.Stats) uint64 { return s.Conflicts }),
		counter("capledger_batch_failures_total", "Batches that failed (store unavailable or conflicts exhausted).",
			func(s engine.Stats) uint64 { return s.Failures }),
		counter("capledger_worker_commands_total", "Commands run by the expiry, unknown-usage, epoch and drain workers.",
			func(s engine.Stats) uint64 { return s.WorkerCmds }),
	)
}

// command counts one answered command of kind under outcome.
func (m *Metrics) command(kind ledger.Kind, outcome string) {
	m.commandCounter(kind, outcome).Inc()
}

// commandsAs counts n answered commands of kind under outcome.
func (m *Metrics) commandsAs(kind ledger.Kind, outcome string, n int) {
	m.commandCounter(kind, outcome).Add(float64(n))
}

// commandCounter returns the capledger_commands_total counter of kind and
// outcome, from the cache when it was used before.
func (m *Metrics) commandCounter(kind ledger.Kind, outcome string) prometheus.Counter {
	key := commandLabels{kind: kind, outcome: outcome}
	if c, ok := m.counters.Load(key); ok {
		return c.(prometheus.Counter)
	}
	c, _ := m.counters.LoadOrStore(key, m.commands.WithLabelValues(kind.String(), outcome))
	return c.(prometheus.Counter)
}

func (m *Metrics) rejection(dimension, reason string) {
	m.rejections.WithLabelValues(dimension, reason, "enforce").Inc()
}

func (m *Metrics) shadowRejection(dimension, reason string) {
	m.rejections.WithLabelValues(dimension, reason, "shadow").Inc()
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}
