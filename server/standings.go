package server

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
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

// standingsRanking is one ranking: the accounts as read at asOf, best
// first, and how many matched; each caller builds its standings from them
// with the rollout modes and generation states of its own time.
type standingsRanking struct {
	ranked  []*rankedStanding
	matched int64
	asOf    time.Time
}

// sharedStandings holds the rankings being computed or still reused.
type sharedStandings = sharedAnswers[standingsQuestion, standingsRanking]

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
		var err error
		page, _, f.After, more, err = s.ledger.AccountsPage(ctx, f)
		if err != nil {
			return readError("accounts", ReasonAccountNotFound, err)
		}
		store.Progressed(ctx)
		matches := func(a *ledger.Account) bool {
			return standingMatches(m, a.Key) && InScope(ctx, a.Key.Subject, a.Key.Route)
		}
		policies, cerr := s.policiesOf(ctx, generationsOf(page, matches))
		if cerr != nil {
			return cerr
		}
		for i := range page {
			a := &page[i]
			index++
			if !matches(a) {
				continue
			}
			p, cerr := policies.get(ctx, a.Key.Generation)
			if cerr != nil {
				return cerr
			}
			matched++
			// The policy cache's deciding generation: a replica's cache
			// may lag a publish elsewhere by its refresh, which orders a
			// ranking only; each standing's active is read from the heads.
			c := &rankedStanding{used: usedFraction(a, &p), index: index,
				idle: !s.policies.decides(a.Key.SubjectKey(), a.Key.Generation)}
			dim, _ := a.Debt()
			c.frozen = dim >= 0
			if !top.wants(c) {
				continue // ranks below every one kept: copy nothing
			}
			c.account = *a
			top.offer(c)
		}
	}
	r.ranked = top.ranked()
	r.matched = matched
	return nil
}

// standingsOf answers a ranking now: its accounts with the rollout modes
// and generation states of now.
func (c consoleService) standingsOf(ctx context.Context, r *standingsRanking) (*v1.ListAccountStandingsResponse, *connect.Error) {
	subjects := make([]ledger.PolicyKey, len(r.ranked))
	for i, ranked := range r.ranked {
		subjects[i] = ranked.account.Key.SubjectKey()
	}
	deciding, cerr := c.deciding(ctx, subjects)
	if cerr != nil {
		return nil, cerr
	}
	generations := make([]uint64, len(r.ranked))
	for i, ranked := range r.ranked {
		generations[i] = ranked.account.Key.Generation
	}
	policies, cerr := c.s.policiesOf(ctx, generations)
	if cerr != nil {
		return nil, cerr
	}
	now := c.s.clock()
	resp := &v1.ListAccountStandingsResponse{Matched: r.matched, AsOf: timestamp(r.asOf)}
	for _, ranked := range r.ranked {
		p, cerr := policies.get(ctx, ranked.account.Key.Generation)
		if cerr != nil {
			return nil, cerr
		}
		resp.Accounts = append(resp.Accounts, c.standingNow(ctx, &ranked.account, &p, deciding, now))
	}
	return resp, nil
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

// deciding returns the generation deciding for each of subjects (absent:
// none decides), read from their keys' heads (Ledger.DecidingGenerations),
// not from every policy.
func (c consoleService) deciding(ctx context.Context, subjects []ledger.PolicyKey) (map[ledger.PolicyKey]uint64, *connect.Error) {
	deciding, err := c.s.ledger.DecidingGenerations(ctx, subjects)
	if err != nil {
		return nil, readError("policies", ReasonPolicyNotFound, err)
	}
	return deciding, nil
}

// standingNow is the account's standing with the rollout mode its
// reserves get now (a staged rollout's on its routes, as the reserve
// path decides) when its generation decides (deciding, per subject key:
// consoleService.deciding).
func (c consoleService) standingNow(ctx context.Context, a *ledger.Account, p *ledger.Policy, deciding map[ledger.PolicyKey]uint64, now time.Time) *v1.AccountStanding {
	k := a.Key
	g, ok := deciding[k.SubjectKey()]
	st := standing(a, p, ok && g == k.Generation, now)
	if st.Active {
		mode := c.s.rollouts.mode(ctx, ledger.RouteKey{Route: k.Route, Region: k.Region}, k.Subject, p.Rollout)
		st.Rollout = rolloutToProto[mode]
	}
	return st
}
