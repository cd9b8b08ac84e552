package server

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The seed's release gates as metrics. The gates that need a full read of
// the ledger (the audit's checks, the debt outstanding, the age of the
// USAGE_UNKNOWN backlog at its 99th percentile) are measured when an audit
// runs (LedgerService.Audit, `capledger audit`, e.g. from a cron job) and
// exported as of that run, with its time: a scrape never reads the whole
// ledger. The count of accounts in debt is read at scrape time from the
// store's debt index instead (debtCountCollector). docs/ROLLOUT.md ("The
// seed's gates as metrics") lists every gate and its metric.
//
//	capledger_audit_discrepancies{check}        discrepancies per audit check
//	capledger_audit_last_run_timestamp_seconds  when the figures were taken
//	capledger_debt_outstanding_units{unit}      debt owed, summed by unit
//	capledger_usage_unknown_age_p99_seconds     99th percentile age of USAGE_UNKNOWN
type gateMetrics struct {
	mu            sync.Mutex
	discrepancies *prometheus.GaugeVec
	lastRun       prometheus.Gauge
	debt          *prometheus.GaugeVec
	unknownP99    prometheus.Gauge
	// fullAudited: a full audit ran here, so the gauges of the checks a
	// since-checkpoint audit skips hold its figures.
	fullAudited bool
}

// auditChecks are the audit's checks, shown at 0 before they find
// anything so that an alert on them has a series from the first audit.
var auditChecks = []string{
	ledger.CheckConservation, ledger.CheckNegative, ledger.CheckReserved, ledger.CheckSpent, ledger.CheckDebt,
	ledger.CheckJournal, ledger.CheckRefundOnce, ledger.CheckMove, ledger.CheckMoveAmounts, ledger.CheckStatement, ledger.CheckShard,
	ledger.CheckBurst, ledger.CheckShardRemint, ledger.CheckShardRecord, ledger.CheckLegacyBudget,
	ledger.CheckCheckpoint,
}

func newGateMetrics(registry *prometheus.Registry) *gateMetrics {
	g := &gateMetrics{
		discrepancies: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "capledger_audit_discrepancies",
			Help: "Discrepancies the last audit on this replica found, by check (conservation, unrecorded_debt, shard_remint_once, ...)."}, []string{"check"}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{Name: "capledger_audit_last_run_timestamp_seconds",
			Help: "When the last audit on this replica ran (0: never); the audit gauges are as of then."}),
		debt: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "capledger_debt_outstanding_units",
			Help: "Debt owed (overdraft issued minus repaid, refill due applied) over every account, by unit, as of the last audit."}, []string{"unit"}),
		unknownP99: prometheus.NewGauge(prometheus.GaugeOpts{Name: "capledger_usage_unknown_age_p99_seconds",
			Help: "99th percentile of how long USAGE_UNKNOWN reservations have waited for a receipt, as of the last audit."}),
	}
	g.discrepancies = adopt(registry, g.discrepancies)
	g.lastRun = adopt(registry, g.lastRun)
	g.debt = adopt(registry, g.debt)
	g.unknownP99 = adopt(registry, g.unknownP99)
	return g
}

// recordGates sets the gauges from one audit in mode: its discrepancies,
// then the debt and the USAGE_UNKNOWN ages read page by page. A
// since-checkpoint audit leaves the gauges of the checks it does not run
// as the last full audit set them (0 before the first), so a cheap audit
// never clears what a full one found. A read that fails leaves the
// previous figures of that gauge (and is logged).
func (s *Server) recordGates(ctx context.Context, found []ledger.Discrepancy, mode string) {
	g := s.gates
	g.mu.Lock()
	defer g.mu.Unlock()
	now := s.clock()
	counts := map[string]int{}
	for _, c := range auditChecks {
		counts[c] = 0
	}
	for _, d := range found {
		counts[d.Check]++
	}
	sinceCheckpoint := mode == auditModeSinceCheckpoint
	for check, n := range counts {
		if sinceCheckpoint && g.fullAudited && ledger.SkippedSinceCheckpoint(check) {
			continue
		}
		g.discrepancies.WithLabelValues(check).Set(float64(n))
	}
	if !sinceCheckpoint {
		g.fullAudited = true
	}
	g.lastRun.Set(float64(now.UnixNano()) / 1e9)

	debt := map[string]int64{}
	var after ledger.AccountKey
	for {
		store.Progressed(ctx) // asking for a page: a bounded caller (Audit) bounds its wait
		page, with, next, more, err := s.ledger.AccountsInDebt(ctx, store.DebtFilter{After: after, Limit: 1000}, nil)
		if err != nil {
			s.log.Warn("gate metrics: debts", "err", err)
			debt = nil
			break
		}
		// Each account's policy as read with it (engine.ShownWith); an
		// account without one is left out.
		for i := range page {
			a := &page[i]
			p, ok := with.Policy(a.Key)
			if !ok {
				continue
			}
			for d := 0; d < a.Dims && d < len(p.Dimensions); d++ {
				if v := a.Balances[d].Debt(); v > 0 {
					debt[p.Dimensions[d].Unit] = ledger.SumUnits(debt[p.Dimensions[d].Unit], v)
				}
			}
		}
		if !more {
			break
		}
		after = next
	}
	if debt != nil {
		g.debt.Reset()
		for unit, v := range debt {
			g.debt.WithLabelValues(unit).Set(float64(v))
		}
	}

	var ages []time.Duration
	f := store.UnknownFilter{Limit: 1000}
	for {
		store.Progressed(ctx)
		page, err := s.ledger.ReservationsUnknown(ctx, f)
		if err != nil {
			s.log.Warn("gate metrics: usage unknown", "err", err)
			return
		}
		for i := range page {
			ages = append(ages, now.Sub(page[i].UnknownAt))
		}
		if len(page) < f.Limit {
			break
		}
		last := &page[len(page)-1]
		f.After = store.UnknownCursor{MarkedAt: last.UnknownAt, ID: last.ID}
	}
	g.unknownP99.Set(p99(ages).Seconds())
}

// p99 is the nearest-rank 99th percentile (0 of none).
func p99(ages []time.Duration) time.Duration {
	if len(ages) == 0 {
		return 0
	}
	slices.Sort(ages)
	rank := (99*len(ages) + 99) / 100 // ceil(0.99 n)
	return ages[rank-1]
}

// adopt registers c, or returns the collector registered under its name
// already (several servers on one Metrics, as in tests).
func adopt[C prometheus.Collector](registry *prometheus.Registry, c C) C {
	if err := registry.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
