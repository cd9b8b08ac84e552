package server

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// A ListAccountStandings ranking that reads every account is shared
// between callers asking the same (sharedAnswers, shared.go) and given
// again until sharedReuseFactor times as old as its scan took.

// standingsQuestion is what a ranking of every account depends on.
type standingsQuestion struct {
	scope                                   string
	subject, subjectContains, route, region string
	generation                              uint64
	limit                                   int
}

// standingsRanking is one ranking: the accounts as read at asOf, each
// with the policy and deciding generation it was read with, best first,
// and how many matched; each caller builds its standings from them with
// the rollout modes of its own time.
type standingsRanking struct {
	ranked  []*rankedStanding
	matched int64
	asOf    time.Time
}

// sharedStandings holds the rankings being computed or still reused.
type sharedStandings = sharedAnswers[standingsQuestion, standingsRanking]

// A ranking shows each standing's active and rolled-back marks as they
// stood when its page was read, so it is not reused across a publish or
// rollback committed through this server (sharedNotBefore, shared.go):
// the marks an operator sees right after `policy publish` or `rollback`
// are the new ones.

// scopeKey names the caller's scope: callers with the same scope see the
// same accounts, so they may share a ranking.
func scopeKey(ctx context.Context) string {
	id, ok := IdentityFrom(ctx)
	if !ok || id.Scope.Unlimited() {
		return ""
	}
	return strings.Join(id.Scope.Subjects, "\x00") + "\x01" + strings.Join(id.Scope.Routes, "\x00")
}

// rankedStanding is a candidate of the ranking: its place in the order
// (in debt first, then accounts whose generation decides, then the
// highest used fraction, then key order) and the account.
type rankedStanding struct {
	frozen bool
	// idle: the account's generation does not decide (superseded or
	// rolled back), so it admits nothing and is near no limit, however
	// empty: a republish moves its capacity to the new generation.
	idle    bool
	used    float64
	index   int
	account ledger.Account
	// policy is the account's policy as read with it (rolled back or
	// not: engine.ShownWith).
	policy ledger.Policy
}

// before reports whether a ranks before b.
func (a *rankedStanding) before(b *rankedStanding) bool {
	if a.frozen != b.frozen {
		return a.frozen
	}
	if a.idle != b.idle {
		return b.idle
	}
	if a.used != b.used {
		return a.used > b.used
	}
	return a.index < b.index
}

// usedFraction is the account's highest used fraction over its
// dimensions, as AccountStanding.usedFraction shows it.
func usedFraction(a *ledger.Account, p *ledger.Policy) float64 {
	var most float64
	for i := 0; i < a.Dims && i < len(p.Dimensions); i++ {
		most = max(most, dimensionUsed(&p.Dimensions[i], &a.Balances[i]))
	}
	return most
}

// dimensionUsed is 1 - available/burst of one dimension, debt counting as
// negative available (so above 1 in debt); 0 without a burst.
func dimensionUsed(d *ledger.Dimension, b *ledger.Balance) float64 {
	if d.Burst <= 0 {
		return 0
	}
	return float64(d.Burst-b.Available+b.Debt()) / float64(d.Burst)
}

// standingsPage is how many accounts rankAll reads at a time.
const standingsPage = 1000

// rankAll ranks for a ListAccountStandings that reads every account, or
// every account of m's subject or of m's route: into r the best limit of the accounts
// matching m in the caller's scope, how many matched, and asOf, the time
// the read began. It reads the accounts page by page (Ledger.AccountsPage),
// keeping only the best limit: its memory is a page's, and no read stays
// open for the whole scan. With a subject the store reads that subject's
// accounts only, and with a route and no subject that route's
// (standingsFilter), in the same key order, so the ranking is the one of
// every account filtered.
func (c consoleService) rankAll(ctx context.Context, m *v1.ListAccountStandingsRequest, limit int, r *standingsRanking) *connect.Error {
	s := c.s
	r.asOf = s.clock()
	top := newBest(limit, (*rankedStanding).before)
	var matched int64
	index := 0
	f := standingsFilter(m)
	for more := true; more; {
		var page []ledger.Account
		var with engine.ShownWith
		var err error
		page, with, f.After, more, err = s.ledger.AccountsPage(ctx, f)
		if err != nil {
			return readError("accounts", ReasonAccountNotFound, err)
		}
		store.Progressed(ctx)
		matches := func(a *ledger.Account) bool {
			return standingMatches(m, a.Key) && InScope(ctx, a.Key.Subject, a.Key.Route)
		}
		for i := range page {
			a := &page[i]
			index++
			if !matches(a) {
				continue
			}
			p, cerr := s.shownPolicy(ctx, with, a.Key)
			if cerr != nil {
				return cerr
			}
			matched++
			// The deciding generation and the policy the page was shown
			// with (one snapshot with its balances): they order the
			// ranking and are the standing's active and rolled-back marks.
			c := &rankedStanding{used: usedFraction(a, &p), index: index, idle: !with.Decides(a.Key)}
			dim, _ := a.Debt()
			c.frozen = dim >= 0
			if !top.wants(c) {
				continue // ranks below every one kept: copy nothing
			}
			c.account, c.policy = *a, p
			top.offer(c)
		}
	}
	r.ranked = top.ranked()
	r.matched = matched
	return nil
}

// standingsOf answers a ranking now: its accounts with the active and
// rolled-back marks they were read with (their page's snapshot, not a
// later read of the heads, which could mark active a generation beside
// balances it never stood with) and the rollout modes of now.
func (c consoleService) standingsOf(ctx context.Context, r *standingsRanking) *v1.ListAccountStandingsResponse {
	now := c.s.clock()
	resp := &v1.ListAccountStandingsResponse{Matched: r.matched, AsOf: timestamp(r.asOf)}
	for _, ranked := range r.ranked {
		resp.Accounts = append(resp.Accounts, c.standingNow(ctx, &ranked.account, &ranked.policy, !ranked.idle, now))
	}
	return resp
}

// standingsFilter is the store's part of m's filters, a page of
// standingsPage: its subject, or without one its route (read by the
// stores' route index, as GetFairness of one route), each with its
// region (which the store reads only with a subject or a route,
// store.AccountFilter). Both read in key order, so the ranking is the
// one of every account filtered. The rest, and the scope, rankAll checks
// on each account.
func standingsFilter(m *v1.ListAccountStandingsRequest) store.AccountFilter {
	f := store.AccountFilter{Subject: m.GetSubject(), Route: m.GetRoute(), Limit: standingsPage}
	if f.Subject != "" || f.Route != "" {
		f.Region = m.GetRegion()
	}
	return f
}

// standingMatches reports whether the account of key passes m's filters.
func standingMatches(m *v1.ListAccountStandingsRequest, k ledger.AccountKey) bool {
	return (m.GetSubject() == "" || m.GetSubject() == k.Subject) &&
		(m.GetSubjectContains() == "" || strings.Contains(k.Subject, m.GetSubjectContains())) &&
		(m.GetRoute() == "" || m.GetRoute() == k.Route) && (m.GetRegion() == "" || m.GetRegion() == k.Region) &&
		(m.GetPolicyGeneration() == 0 || m.GetPolicyGeneration() == k.Generation)
}

// standingNow is the account's standing with the rollout mode its
// reserves get now (a staged rollout's on its routes, as the reserve
// path decides) when its generation decides (active: as read with the
// account, engine.ShownWith).
func (c consoleService) standingNow(ctx context.Context, a *ledger.Account, p *ledger.Policy, active bool, now time.Time) *v1.AccountStanding {
	k := a.Key
	st := standing(a, p, active, now)
	if st.Active {
		// Without the rollouts (unreadable, no copy) the policy's own mode.
		mode, _ := c.s.rollouts.mode(ctx, ledger.RouteKey{Route: k.Route, Region: k.Region}, k.Subject, p.Rollout)
		st.Rollout = rolloutToProto[mode]
	}
	return st
}
