package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// debtCountCollector exports capledger_debt_accounts, the accounts whose
// stored row owes debt, counted from the store's debt index when scraped
// (Ledger.AccountsInDebtCount; at most once per backlogCacheFor, within
// backlogTimeout, as the USAGE_UNKNOWN backlog): right on every replica
// from its start, audit or not. On PostgreSQL every replica reports the
// same store-wide figure: aggregate with max, not sum. When the store
// cannot be read the gauge is left out of that scrape (and the error
// logged), so an alert sees no data instead of a false zero.
type debtCountCollector struct {
	ledger Ledger
	log    *slog.Logger
	clock  func() time.Time
	desc   *prometheus.Desc

	mu     sync.Mutex
	readAt time.Time
	last   int64
	err    error
}

func (m *Metrics) registerDebtCount(l Ledger, log *slog.Logger, clock func() time.Time) {
	m.registry.MustRegister(&debtCountCollector{
		ledger: l, log: log, clock: clock,
		desc: prometheus.NewDesc("capledger_debt_accounts",
			"Accounts whose stored row owes debt (overdraft issued above repaid), store-wide, from the store's debt index; refill due since an account's last command is not applied.", nil, nil),
	})
}

func (c *debtCountCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *debtCountCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.clock(); c.readAt.IsZero() || now.Sub(c.readAt) >= backlogCacheFor {
		ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
		c.last, c.err = c.ledger.AccountsInDebtCount(ctx)
		cancel()
		c.readAt = now
		if c.err != nil {
			c.log.Warn("metrics: cannot count the accounts in debt", "err", c.err)
		}
	}
	if c.err == nil {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(c.last))
	}
}
