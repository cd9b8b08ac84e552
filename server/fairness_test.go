package server_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// fairnessTraffic: 30 subjects on chat.generate under a "*" policy
// (weight 1, budget 0.3), five of them (t-00 .. t-04) with policies of
// their own (weight 2 or 3, budget 0.5), each spending its own amount;
// and 3 subjects on embed.
func fairnessTraffic(h *harness) {
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","fairnessBudget":0.3,
	  "dimensions":[{"unit":"tokens","burst":"1000"}]}}`, adminToken)
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"embed","dimensions":[{"unit":"tokens","burst":"1000"}]}}`, adminToken)
	for i := range 5 {
		h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"t-%02d","route":"chat.generate","fairnessWeight":"%d","fairnessBudget":0.5,
		  "dimensions":[{"unit":"tokens","burst":"1000"}]}}`, i, 2+i%2), adminToken)
	}
	spend := func(id, subject, route string, tokens int) {
		h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":%q,"units":{"tokens":400}}`, id, subject, route), adminToken)
		h.ok("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op"}`, id), adminToken)
		h.ok("Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op","actualUnits":{"tokens":%d}}`, id, tokens), adminToken)
	}
	for i := range 30 {
		spend(fmt.Sprintf("f-%d", i), fmt.Sprintf("t-%02d", i), "chat.generate", 40+(i*37)%131)
	}
	for i := range 3 {
		spend(fmt.Sprintf("e-%d", i), fmt.Sprintf("e-%02d", i), "embed", 10*(i+1))
	}
}

// bruteShare is one subject's share as the old GetFairness computed it:
// over every account of the store at once.
type bruteShare struct {
	subject       string
	err, budget   float64
	spent, weight int64
}

type bruteGroup struct {
	totalSpent  int64
	totalWeight float64
	outside     int64
	shares      []bruteShare // the largest error first, then by subject
}

// bruteFairness computes every group from all accounts and policies of
// the store in one read, share by share.
func bruteFairness(t *testing.T, st store.Store) map[string]*bruteGroup {
	t.Helper()
	ctx := context.Background()
	policies, err := st.PolicyList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byGen := map[uint64]ledger.Policy{}
	for _, p := range policies {
		byGen[p.Generation] = p
	}
	active := ledger.NewActiveGenerations(policies)
	accounts, err := st.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]*bruteGroup{}
	for _, a := range accounts {
		if g, _ := active.Deciding(a.Key.SubjectKey()); g != a.Key.Generation {
			continue
		}
		p := byGen[a.Key.Generation]
		for d := 0; d < a.Dims; d++ {
			key := a.Key.Route + "@" + a.Key.Region + "/" + p.Dimensions[d].Unit
			g := groups[key]
			if g == nil {
				g = &bruteGroup{}
				groups[key] = g
			}
			w := max(p.FairnessWeight, 1)
			g.totalSpent += a.Balances[d].Spent
			g.totalWeight += float64(w)
			g.shares = append(g.shares, bruteShare{subject: a.Key.Subject, spent: a.Balances[d].Spent, weight: w, budget: p.FairnessBudget})
		}
	}
	for _, g := range groups {
		for i := range g.shares {
			s := &g.shares[i]
			fair := float64(s.weight) / g.totalWeight
			served := float64(s.spent) / float64(g.totalSpent)
			s.err = math.Abs(served-fair) / fair
			if s.err > s.budget {
				g.outside++
			}
		}
		sort.Slice(g.shares, func(i, j int) bool {
			a, b := g.shares[i], g.shares[j]
			if a.err != b.err {
				return a.err > b.err
			}
			return a.subject < b.subject
		})
	}
	return groups
}

// checkFairness compares a GetFairness answer with limit with the brute
// force's groups.
func checkFairness(t *testing.T, got map[string]any, want map[string]*bruteGroup, limit int) {
	t.Helper()
	groups, _ := got["groups"].([]any)
	if len(groups) != len(want) {
		t.Fatalf("%d groups, want %d: %v", len(groups), len(want), got)
	}
	for _, g := range groups {
		g := g.(map[string]any)
		key := fmt.Sprintf("%s@%s/%s", g["route"], g["region"], g["unit"])
		w := want[key]
		if w == nil {
			t.Fatalf("group %s not in the store", key)
		}
		if num(g["totalSpent"]) != w.totalSpent || num(g["subjectCount"]) != int64(len(w.shares)) ||
			num(g["outsideBudget"]) != w.outside || g["totalWeight"] != w.totalWeight {
			t.Errorf("group %s: totalSpent %v subjectCount %v outsideBudget %v totalWeight %v; want %d %d %d %v",
				key, g["totalSpent"], g["subjectCount"], g["outsideBudget"], g["totalWeight"], w.totalSpent, len(w.shares), w.outside, w.totalWeight)
		}
		listed, _ := g["subjects"].([]any)
		wantListed := w.shares[:min(limit, len(w.shares))]
		if len(listed) != len(wantListed) {
			t.Errorf("group %s lists %d subjects, want %d", key, len(listed), len(wantListed))
			continue
		}
		for i, s := range listed {
			s := s.(map[string]any)
			e, _ := s["error"].(float64)
			ws := wantListed[i]
			if s["subject"] != ws.subject || math.Abs(e-ws.err) > 1e-12 || num(s["spent"]) != ws.spent || num(s["weight"]) != ws.weight ||
				(s["withinBudget"] == true) != (ws.err <= ws.budget) {
				t.Errorf("group %s, place %d: %v; want %s error %v spent %d weight %d", key, i, s, ws.subject, ws.err, ws.spent, ws.weight)
			}
		}
	}
}

// GetFairness answers per group the totals over every subject, how many
// are outside their budget, and the limit subjects farthest from their
// fair share, as a computation over every account at once does.
func TestConsoleFairnessTotalsMatchEveryAccount(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	fairnessTraffic(h)
	want := bruteFairness(t, h.store)
	if g := want["chat.generate@global/tokens"]; g == nil || g.outside == 0 || g.outside == int64(len(g.shares)) {
		t.Fatalf("the traffic should put some subjects, not all, outside their budget: %+v", g)
	}
	for _, limit := range []int{1, 5, 29, 30, 1000} {
		checkFairness(t, h.consoleOK("GetFairness", fmt.Sprintf(`{"limit":%d}`, limit), consoleViewer), want, limit)
	}
	onlyEmbed := h.consoleOK("GetFairness", `{"route":"embed","limit":2}`, consoleViewer)
	checkFairness(t, onlyEmbed, map[string]*bruteGroup{"embed@global/tokens": want["embed@global/tokens"]}, 2)
}

// Without a limit each group lists 20 subjects; a limit of 1000 is the
// largest; a negative one or one above 1000 is refused naming the
// limit.
func TestConsoleFairnessLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	fairnessTraffic(h)
	want := bruteFairness(t, h.store)
	checkFairness(t, h.consoleOK("GetFairness", `{}`, consoleViewer), want, 20)
	checkFairness(t, h.consoleOK("GetFairness", `{"limit":1000}`, consoleViewer), want, 1000)
	for _, limit := range []string{"-1", "1001", "2147483647"} {
		r := h.consoleCall("GetFairness", `{"limit":`+limit+`}`, consoleViewer)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "limit "+limit) {
			t.Errorf("limit %s refused with %q, want it named", limit, msg)
		}
	}
}

// Three tabs asking for the Fairness page while one computation runs
// get that one's answer, saying when its accounts were read; a scoped
// token gets one of its own, counting only its tenants.
func TestConsoleFairnessSharesOneComputation(t *testing.T) {
	scans := &gatedScans{release: make(chan struct{})}
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		scans.Store = st
		return scans
	}})
	consoleTraffic(h)
	readAt := h.clock.Now()
	answers := callersDuringOneComputation(h, scans.count, scans.release, 200*time.Millisecond, func() map[string]any {
		return h.consoleOK("GetFairness", `{}`, consoleViewer)
	})
	if got := scans.count(); got != 1 {
		t.Fatalf("%d scans for three callers, want one", got)
	}
	for i, a := range answers {
		g, _ := a["groups"].([]any)
		if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(a["asOf"])); err != nil || !at.Equal(readAt) || len(g) != 1 ||
			num(g[0].(map[string]any)["subjectCount"]) != 2 {
			t.Errorf("caller %d: %v; want asOf %v and one group of 2 subjects", i, a, readAt)
		}
	}
	scoped := h.consoleOK("GetFairness", `{}`, consoleScoped)
	g, _ := scoped["groups"].([]any)
	if len(g) != 1 || num(g[0].(map[string]any)["subjectCount"]) != 1 || num(g[0].(map[string]any)["totalSpent"]) != 50 || scans.count() != 2 {
		t.Errorf("scoped token: %v after %d scans; want its own computation over its one account", scoped, scans.count())
	}
}
