package server

import (
	"context"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Default and largest limit of GetFairness: subjects listed per group.
const (
	defaultFairnessLimit = 20
	maxFairnessLimit     = 1000
)

// fairnessQuestion is what a GetFairness answer depends on.
type fairnessQuestion struct {
	scope, route string
	limit        int
}

// sharedFairness holds the GetFairness answers being computed or still
// reused (sharedAnswers).
type sharedFairness = sharedAnswers[fairnessQuestion, *v1.GetFairnessResponse]

// GetFairness implements ConsoleService.GetFairness: per group, the
// totals over every subject and the limit subjects farthest from their
// fair share, from one shared computation (fairness), not reused across
// a publish or rollback committed through this server (sharedNotBefore).
func (c consoleService) GetFairness(ctx context.Context, req *connect.Request[v1.GetFairnessRequest]) (*connect.Response[v1.GetFairnessResponse], error) {
	limit := int(req.Msg.GetLimit())
	switch {
	case limit < 0 || limit > maxFairnessLimit:
		return nil, invalidField(ReasonInvalidCommand, "limit", "%d: want 1 to %d (0 for %d)", limit, maxFairnessLimit, defaultFairnessLimit)
	case limit == 0:
		limit = defaultFairnessLimit
	}
	q := fairnessQuestion{scope: scopeKey(ctx), route: req.Msg.GetRoute(), limit: limit}
	answer, cerr := c.s.fairness.answer(ctx, q, c.s.sharedNotBefore(), func(ctx context.Context, resp **v1.GetFairnessResponse) *connect.Error {
		var cerr *connect.Error
		*resp, cerr = c.fairness(ctx, q)
		return cerr
	})
	if cerr != nil {
		return nil, cerr
	}
	// Each caller gets its own copy: the shared one is read by others
	// while this one is marshalled.
	return connect.NewResponse(proto.Clone(*answer).(*v1.GetFairnessResponse)), nil
}

// fairnessGroup gathers one group (route, region, unit) during the scan.
type fairnessGroup struct {
	route, region, unit string
	// totalSpent is the answer's, capped at the int64 bound
	// (ledger.SumUnits); totalSpentShares the same sum as float64, which
	// the shares are computed from, so a capped total never skews them.
	totalSpent       int64
	totalSpentShares float64
	totalWeight      float64
	subjects         int64
	// spent holds every subject's spent by its generation, whose weight
	// and budget they share: whether a subject is within its budget
	// depends on the group's totals, known only at the end. 8 bytes a
	// subject.
	spent map[uint64]*generationSpent
	// most and least keep the limit subjects with the highest and the
	// lowest spent per weight: whatever the totals turn out to be, the
	// limit farthest from their fair share are among them (the error,
	// |spent/weight × totalWeight/totalSpent − 1|, grows with the
	// distance of spent per weight from one point).
	most, least *best[fairCandidate]
}

type generationSpent struct {
	weight int64
	budget float64
	spent  []int64
}

// fairCandidate is a subject that may be listed.
type fairCandidate struct {
	perWeight  float64
	subject    string
	generation uint64
	weight     int64
	spent      int64
	budget     float64
}

func moreSpentPerWeight(a, b fairCandidate) bool {
	if a.perWeight != b.perWeight {
		return a.perWeight > b.perWeight
	}
	return a.subject < b.subject
}

func lessSpentPerWeight(a, b fairCandidate) bool {
	if a.perWeight != b.perWeight {
		return a.perWeight < b.perWeight
	}
	return a.subject < b.subject
}

// fairnessError is e_i = |served - fair| / fair of a subject that spent
// spent with weight weight in a group of totalSpent and totalWeight, the
// one formula of both the shares listed and the counts.
func fairnessError(spent, weight int64, totalSpent, totalWeight float64) (served, fair, e float64) {
	fair = float64(weight) / totalWeight
	if totalSpent > 0 {
		served = float64(spent) / totalSpent
	}
	return served, fair, abs(served-fair) / fair
}

// fairness computes a GetFairness answer for q: it reads every account,
// or with a route that route's only (the stores' route index), page by
// page (Ledger.AccountsPage, no read open for the whole scan),
// counts the account of each subject's deciding generation (as its
// key's heads say when its page is read: the page's own, read with it in
// one read of their heads, not every policy) in the caller's scope, and keeps
// per group the totals, 8 bytes per subject and the 2 × limit candidates
// to list.
func (c consoleService) fairness(ctx context.Context, q fairnessQuestion) (*v1.GetFairnessResponse, *connect.Error) {
	s := c.s
	resp := &v1.GetFairnessResponse{AsOf: timestamp(s.clock())}
	type groupKey struct{ route, region, unit string }
	groups := map[groupKey]*fairnessGroup{}
	for after, more := (ledger.AccountKey{}), true; more; {
		var page []ledger.Account
		var with engine.ShownWith
		var err error
		page, with, after, more, err = s.ledger.AccountsPage(ctx, store.AccountFilter{Route: q.route, After: after, Limit: standingsPage})
		if err != nil {
			return nil, readError("accounts", ReasonAccountNotFound, err)
		}
		store.Progressed(ctx)
		// Only the account that admits for each subject now counts.
		counted := func(a *ledger.Account) bool {
			k := a.Key
			return (q.route == "" || q.route == k.Route) && with.Decides(k) && InScope(ctx, k.Subject, k.Route)
		}
		for i := range page {
			a := &page[i]
			k := a.Key
			if !counted(a) {
				continue
			}
			p, cerr := s.shownPolicy(ctx, with, k)
			if cerr != nil {
				return nil, cerr
			}
			weight := max(p.FairnessWeight, 1)
			for d := 0; d < a.Dims && d < len(p.Dimensions); d++ {
				gk := groupKey{k.Route, k.Region, p.Dimensions[d].Unit}
				g := groups[gk]
				if g == nil {
					g = &fairnessGroup{route: gk.route, region: gk.region, unit: gk.unit, spent: map[uint64]*generationSpent{},
						most: newBest(q.limit, moreSpentPerWeight), least: newBest(q.limit, lessSpentPerWeight)}
					groups[gk] = g
				}
				spent := a.Balances[d].Spent
				g.subjects++
				g.totalSpent = ledger.SumUnits(g.totalSpent, spent)
				g.totalSpentShares += float64(spent)
				// Summed as float64: weights stored before the 2^20 bound
				// may be up to 2^63-1, and an int64 sum of two wrapped
				// negative.
				g.totalWeight += float64(weight)
				gs := g.spent[k.Generation]
				if gs == nil {
					gs = &generationSpent{weight: weight, budget: p.FairnessBudget}
					g.spent[k.Generation] = gs
				}
				gs.spent = append(gs.spent, spent)
				cand := fairCandidate{perWeight: float64(spent) / float64(weight), subject: k.Subject, generation: k.Generation,
					weight: weight, spent: spent, budget: p.FairnessBudget}
				g.most.offer(cand)
				g.least.offer(cand)
			}
		}
	}
	for _, g := range groups {
		resp.Groups = append(resp.Groups, g.answer(q.limit))
	}
	slices.SortFunc(resp.Groups, func(a, b *v1.FairnessGroup) int {
		return strings.Compare(a.Route+"\x00"+a.Region+"\x00"+a.Unit, b.Route+"\x00"+b.Region+"\x00"+b.Unit)
	})
	return resp, nil
}

// answer is the group's totals, its count outside budget and its limit
// subjects farthest from their fair share.
func (g *fairnessGroup) answer(limit int) *v1.FairnessGroup {
	out := &v1.FairnessGroup{Route: g.route, Region: g.region, Unit: g.unit, TotalSpent: g.totalSpent,
		SubjectCount: g.subjects, TotalWeight: g.totalWeight}
	for _, gs := range g.spent {
		for _, spent := range gs.spent {
			if _, _, e := fairnessError(spent, gs.weight, g.totalSpentShares, g.totalWeight); e > gs.budget {
				out.OutsideBudget++
			}
		}
	}
	seen := map[string]bool{}
	for _, cand := range append(g.most.ranked(), g.least.ranked()...) {
		if seen[cand.subject] {
			continue // a small group's subject is in both
		}
		seen[cand.subject] = true
		served, fair, e := fairnessError(cand.spent, cand.weight, g.totalSpentShares, g.totalWeight)
		out.Subjects = append(out.Subjects, &v1.FairnessShare{
			Subject: cand.subject, PolicyGeneration: cand.generation, Weight: cand.weight, Spent: cand.spent,
			ServedShare: served, FairShare: fair, Error: e, Budget: cand.budget, WithinBudget: e <= cand.budget,
		})
	}
	slices.SortFunc(out.Subjects, func(a, b *v1.FairnessShare) int {
		if a.Error != b.Error {
			if a.Error > b.Error {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Subject, b.Subject)
	})
	out.Subjects = out.Subjects[:min(limit, len(out.Subjects))]
	return out
}
