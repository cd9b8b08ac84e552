package server

import (
	"container/heap"
	"context"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
)

// A ListAccountStandings ranking that reads every account costs time in
// proportion to the accounts: at a million of them, seconds of the
// server's CPU. The console's Tenants page asks for it every 5 s in every
// open tab, so the server computes one ranking per distinct question (the
// filters, the limit and the caller's scope) at a time, shares it with
// every caller asking the same while it runs, and answers it again until
// it is standingsReuseFactor times as old as its scan took: however many
// tabs are open, ranking takes at most about a tenth of a core, and a
// small ledger (a scan of milliseconds) is answered fresh. Each answer
// carries its asOf.
const standingsReuseFactor = 9

// standingsQuestion is what a ranking of every account depends on.
type standingsQuestion struct {
	scope                                   string
	subject, subjectContains, route, region string
	generation                              uint64
	limit                                   int
}

// standingsRanking is one computation of a question: running until done
// is closed, then its answer (or error) until reuseUntil. The answer is
// the accounts as read at asOf, best first, and how many matched; each
// caller builds its standings from them with the rollout modes and
// generation states of its own time.
type standingsRanking struct {
	done       chan struct{}
	ranked     []*rankedStanding
	matched    int64
	asOf       time.Time
	err        *connect.Error
	reuseUntil time.Time
}

// sharedStandings holds the rankings being computed or still reused.
type sharedStandings struct {
	mu       sync.Mutex
	rankings map[standingsQuestion]*standingsRanking
}

func newSharedStandings() *sharedStandings {
	return &sharedStandings{rankings: map[standingsQuestion]*standingsRanking{}}
}

// scopeKey names the caller's scope: callers with the same scope see the
// same accounts, so they may share a ranking.
func scopeKey(ctx context.Context) string {
	id, ok := IdentityFrom(ctx)
	if !ok || id.Scope.Unlimited() {
		return ""
	}
	return strings.Join(id.Scope.Subjects, "\x00") + "\x01" + strings.Join(id.Scope.Routes, "\x00")
}

// answer returns the ranking of q: the one being computed (waiting for
// it), one still young enough to reuse, or a new one computed by rank.
// Callers must not change it. A failed ranking is not reused.
func (sh *sharedStandings) answer(ctx context.Context, q standingsQuestion, rank func(r *standingsRanking) *connect.Error) (*standingsRanking, *connect.Error) {
	sh.mu.Lock()
	r := sh.rankings[q]
	if r != nil {
		select {
		case <-r.done:
			if r.err != nil || !time.Now().Before(r.reuseUntil) {
				r = nil
			}
		default: // still running: wait for it below
		}
	}
	if r == nil {
		for k, old := range sh.rankings { // forget the stale ones
			select {
			case <-old.done:
				if !time.Now().Before(old.reuseUntil) {
					delete(sh.rankings, k)
				}
			default:
			}
		}
		r = &standingsRanking{done: make(chan struct{})}
		sh.rankings[q] = r
		sh.mu.Unlock()
		// The ranking runs apart from this caller's context: a caller
		// that gives up must not fail the others waiting for it.
		started := time.Now()
		r.err = rank(r)
		took := time.Since(started)
		r.reuseUntil = time.Now().Add(standingsReuseFactor * took)
		close(r.done)
	} else {
		sh.mu.Unlock()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	if r.err != nil {
		return nil, r.err
	}
	return r, nil
}

// rankedStanding is a candidate of the ranking: its place in the order
// (in debt first, then the highest used fraction, then key order) and
// the account.
type rankedStanding struct {
	frozen  bool
	used    float64
	index   int
	account ledger.Account
}

// before reports whether a ranks before b.
func (a *rankedStanding) before(b *rankedStanding) bool {
	if a.frozen != b.frozen {
		return a.frozen
	}
	if a.used != b.used {
		return a.used > b.used
	}
	return a.index < b.index
}

// topStandings keeps the best limit candidates: a heap whose root is the
// one that ranks last, pushed out when a better one comes.
type topStandings []*rankedStanding

func (t topStandings) Len() int           { return len(t) }
func (t topStandings) Less(i, j int) bool { return t[j].before(t[i]) }
func (t topStandings) Swap(i, j int)      { t[i], t[j] = t[j], t[i] }
func (t *topStandings) Push(x any)        { *t = append(*t, x.(*rankedStanding)) }
func (t *topStandings) Pop() any {
	old := *t
	x := old[len(old)-1]
	*t = old[:len(old)-1]
	return x
}

// offer adds c if it ranks among the best limit so far.
func (t *topStandings) offer(c *rankedStanding, limit int) {
	if len(*t) < limit {
		heap.Push(t, c)
		return
	}
	if c.before((*t)[0]) {
		(*t)[0] = c
		heap.Fix(t, 0)
	}
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

// rankAll ranks for a ListAccountStandings that reads every account:
// into r the best limit of the accounts matching m in the caller's
// scope, how many matched, and asOf, the time the read began. It reads
// the accounts page by page (Ledger.AccountsPage), keeping only the best
// limit: its memory is a page's, and no read stays open for the whole
// scan.
func (c consoleService) rankAll(ctx context.Context, m *v1.ListAccountStandingsRequest, limit int, r *standingsRanking) *connect.Error {
	s := c.s
	r.asOf = s.clock()
	top := make(topStandings, 0, limit)
	var matched int64
	index := 0
	for after, more := (ledger.AccountKey{}), true; more; {
		var page []ledger.Account
		var err error
		page, after, more, err = s.ledger.AccountsPage(ctx, after, standingsPage)
		if err != nil {
			return readError("accounts", ReasonAccountNotFound, err)
		}
		for i := range page {
			a := &page[i]
			index++
			if !standingMatches(m, a.Key) || !InScope(ctx, a.Key.Subject, a.Key.Route) {
				continue
			}
			p, cerr := s.Policy(ctx, a.Key.Generation)
			if cerr != nil {
				return cerr
			}
			matched++
			c := &rankedStanding{used: usedFraction(a, &p), index: index}
			dim, _ := a.Debt()
			c.frozen = dim >= 0
			if len(top) == limit && !c.before(top[0]) {
				continue // ranks below every one kept: copy nothing
			}
			c.account = *a
			top.offer(c, limit)
		}
	}
	r.ranked = make([]*rankedStanding, len(top))
	for i := len(top) - 1; i >= 0; i-- {
		r.ranked[i] = heap.Pop(&top).(*rankedStanding)
	}
	r.matched = matched
	return nil
}

// standingsOf answers a ranking now: its accounts with the rollout modes
// and generation states of now.
func (c consoleService) standingsOf(ctx context.Context, r *standingsRanking) (*v1.ListAccountStandingsResponse, *connect.Error) {
	policies, err := c.s.ledger.Policies(ctx)
	if err != nil {
		return nil, readError("policies", ReasonPolicyNotFound, err)
	}
	active := ledger.NewActiveGenerations(policies)
	now := c.s.clock()
	resp := &v1.ListAccountStandingsResponse{Matched: r.matched, AsOf: timestamp(r.asOf)}
	for _, ranked := range r.ranked {
		p, cerr := c.s.Policy(ctx, ranked.account.Key.Generation)
		if cerr != nil {
			return nil, cerr
		}
		resp.Accounts = append(resp.Accounts, c.standingNow(ctx, &ranked.account, &p, active, now))
	}
	return resp, nil
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
// path decides) when its generation decides.
func (c consoleService) standingNow(ctx context.Context, a *ledger.Account, p *ledger.Policy, active ledger.ActiveGenerations, now time.Time) *v1.AccountStanding {
	k := a.Key
	deciding, _ := active.Deciding(k.SubjectKey())
	st := standing(a, p, deciding == k.Generation, now)
	if st.Active {
		mode := c.s.rollouts.mode(ctx, ledger.RouteKey{Route: k.Route, Region: k.Region}, k.Subject, p.Rollout)
		st.Rollout = rolloutToProto[mode]
	}
	return st
}
