package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
)

// ResolverView is what the server shows of the USAGE_UNKNOWN resolver
// (engine.Engine implements it): which backlog entries are past their
// unknownDeadline, and the resolver's counters for /metrics.
type ResolverView interface {
	UnknownOverdue(r *ledger.Reservation, now time.Time) bool
	ResolverStats() engine.ResolverStats
}

var _ ResolverView = (*engine.Engine)(nil)

// registerResolver exports the resolver's figures. The overdue gauge is
// left out of a scrape until the resolver completed one scan of the
// backlog, so an alert sees no data rather than a false zero.
func (m *Metrics) registerResolver(v ResolverView) {
	m.registry.MustRegister(&resolverCollector{
		view: v,
		overdue: prometheus.NewDesc("capledger_usage_unknown_overdue",
			"USAGE_UNKNOWN reservations past their route's unknownDeadline at the resolver's last complete scan: still held, waiting for an operator.", nil, nil),
		polls: prometheus.NewDesc("capledger_resolver_polls_total",
			"Operation-status calls of the USAGE_UNKNOWN resolver, by outcome (ok: an answer it could read, a signed status or a 404 for no record of the operation; error: anything else, which leaves the reservation USAGE_UNKNOWN).", []string{"outcome"}, nil),
		settled: prometheus.NewDesc("capledger_resolver_settled_total",
			"USAGE_UNKNOWN reservations the resolver settled, by the answer (finished: its actual units; never_started: zero usage).", []string{"answer"}, nil),
	})
}

type resolverCollector struct {
	view                    ResolverView
	overdue, polls, settled *prometheus.Desc
}

func (c *resolverCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.overdue
	ch <- c.polls
	ch <- c.settled
}

func (c *resolverCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.view.ResolverStats()
	if s.Scanned {
		ch <- prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, float64(s.Overdue))
	}
	ch <- prometheus.MustNewConstMetric(c.polls, prometheus.CounterValue, float64(s.Polls-s.Failures), "ok")
	ch <- prometheus.MustNewConstMetric(c.polls, prometheus.CounterValue, float64(s.Failures), "error")
	ch <- prometheus.MustNewConstMetric(c.settled, prometheus.CounterValue, float64(s.Settled-s.SettledNeverStarted), "finished")
	ch <- prometheus.MustNewConstMetric(c.settled, prometheus.CounterValue, float64(s.SettledNeverStarted), "never_started")
}

// overdueFirst moves the page's reservations past their deadline to its
// front (each part keeps its oldest-first order) and returns their ids.
func overdueFirst(v ResolverView, rows []ledger.Reservation, now time.Time) []string {
	if v == nil {
		return nil
	}
	var overdue, rest []ledger.Reservation
	var ids []string
	for i := range rows {
		if v.UnknownOverdue(&rows[i], now) {
			overdue = append(overdue, rows[i])
			ids = append(ids, rows[i].ID)
		} else {
			rest = append(rest, rows[i])
		}
	}
	copy(rows, append(overdue, rest...))
	return ids
}
