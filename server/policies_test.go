package server_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capledger/capledger/store"
)

// policyBodyFor is a publish of a one-unit policy for subject on route,
// its burst making each publish of a key a new generation.
func policyBodyFor(subject, route string, burst int) string {
	return fmt.Sprintf(`{"policy":{"subject":%q,"route":%q,"dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"1","refillInterval":"1s"}]}}`,
		subject, route, burst)
}

// policyPages follows ListPolicies' pages of body (a JSON object without
// its closing brace's page fields) as token, returning every policy
// shown in order and the sizes of the pages.
func policyPages(t *testing.T, h *harness, body string, pageSize int, token string) (policies []map[string]any, sizes []int) {
	t.Helper()
	next := ""
	for calls := 0; ; calls++ {
		if calls > 1000 {
			t.Fatalf("ListPolicies %s: more than 1000 pages", body)
		}
		req := strings.TrimSuffix(body, "}")
		if req != "{" {
			req += ","
		}
		req += fmt.Sprintf(`"pageSize":%d,"pageToken":%q}`, pageSize, next)
		page := h.ok("ListPolicies", req, token)
		list, _ := page["policies"].([]any)
		for _, p := range list {
			policies = append(policies, p.(map[string]any))
		}
		sizes = append(sizes, len(list))
		next, _ = page["nextPageToken"].(string)
		if next == "" {
			return policies, sizes
		}
	}
}

func generationsOf(policies []map[string]any) []uint64 {
	var out []uint64
	for _, p := range policies {
		g, _ := strconv.ParseUint(p["generation"].(string), 10, 64)
		out = append(out, g)
	}
	return out
}

// Following nextPageToken pages through every policy exactly once, oldest
// first, whatever the page size (0: the default of 100); each page shows
// what the unpaged list showed of it (active, rolledBack), and a filter
// pages only the policies it selects. With and without a tokens file
// (sealed and plain tokens).
func TestListPoliciesPagesSeeEachPolicyOnce(t *testing.T) {
	for _, auth := range []bool{false, true} {
		t.Run(fmt.Sprintf("auth=%v", auth), func(t *testing.T) {
			h := newHarness(t, harnessOptions{auth: auth})
			token := ""
			if auth {
				token = adminToken
			}
			// 133 generations: 120 subjects, tenant-0 published 14 times
			// (the last rolled back: the one before is active).
			for i := range 120 {
				h.ok("PublishPolicy", policyBodyFor(fmt.Sprintf("tenant-%d", i), "chat.generate", 100), token)
				if i%10 == 0 {
					h.ok("PublishPolicy", policyBodyFor("tenant-0", "chat.generate", 200+i), token)
				}
			}
			h.ok("PublishPolicy", policyBodyFor("tenant-0", "chat.generate", 999), token)
			const n = 133
			h.ok("RollbackPolicy", `{"generation":"133"}`, adminTokenIf(auth))
			var want []uint64
			for g := uint64(1); g <= n; g++ {
				want = append(want, g)
			}
			for _, size := range []int{0, 1, 7, 100, 132, 133, 1000} {
				policies, sizes := policyPages(t, h, `{}`, size, token)
				if got := generationsOf(policies); !slices.Equal(got, want) {
					t.Fatalf("pages of %d: generations %v, want 1 to %d once each, in order", size, got, n)
				}
				limit := size
				if size == 0 {
					limit = 100
				}
				for i, got := range sizes {
					if got > limit || i < len(sizes)-1 && got != limit {
						t.Fatalf("pages of %d: sizes %v", size, sizes)
					}
				}
				for _, p := range policies {
					g := p["generation"].(string)
					one := h.ok("GetPolicy", `{"generation":"`+g+`"}`, token)["policy"].(map[string]any)
					if p["active"] != one["active"] || p["rolledBack"] != one["rolledBack"] {
						t.Fatalf("pages of %d: generation %s listed active %v rolledBack %v, GetPolicy says %v %v", size, g, p["active"], p["rolledBack"], one["active"], one["rolledBack"])
					}
				}
			}
			tenant0, _ := policyPages(t, h, `{"subject":"tenant-0"}`, 5, token)
			if got := generationsOf(tenant0); len(got) != 14 || got[0] != 1 || got[13] != 133 {
				t.Fatalf("tenant-0's pages: %v, want its 14 generations", got)
			}
			var active []uint64
			for _, p := range tenant0 {
				if p["active"] == true {
					active = append(active, generationsOf([]map[string]any{p})...)
				}
			}
			if prev := generationsOf(tenant0[12:13]); !slices.Equal(active, prev) || tenant0[13]["rolledBack"] != true {
				t.Fatalf("tenant-0's active generations %v (want %v, the one before the rolled-back 133), the last %v", active, prev, tenant0[13])
			}
			if none, _ := policyPages(t, h, `{"subject":"tenant-0","region":"us"}`, 5, token); len(none) != 0 {
				t.Fatalf("a filter selecting nothing: %v", none)
			}
		})
	}
}

func adminTokenIf(auth bool) string {
	if auth {
		return adminToken
	}
	return ""
}

// pageSize is 0 (the default, 100) or 1 to 1000; anything else is 400
// INVALID_COMMAND naming the bounds.
func TestListPoliciesPageSizeBounds(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for i := range 3 {
		h.ok("PublishPolicy", policyBodyFor(fmt.Sprintf("tenant-%d", i), "chat", 10), "")
	}
	for _, size := range []string{"-1", "1001", "2147483647", "-2147483648"} {
		r := h.call("ListPolicies", `{"pageSize":`+size+`}`, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "want 1 to 1000 (0 for 100)") {
			t.Errorf("pageSize %s: message %q", size, msg)
		}
	}
	for _, c := range []struct {
		size string
		want int
		more bool
	}{{"0", 3, false}, {"1", 1, true}, {"2", 2, true}, {"3", 3, false}, {"1000", 3, false}} {
		page := h.ok("ListPolicies", `{"pageSize":`+c.size+`}`, "")
		list, _ := page["policies"].([]any)
		_, more := page["nextPageToken"]
		if len(list) != c.want || more != c.more {
			t.Errorf("pageSize %s: %d policies, next token %v; want %d, %v", c.size, len(list), more, c.want, c.more)
		}
	}
}

// A page token is ListPolicies' own, for the filters and the token it was
// issued for: another method's, a hand-built one, one issued to another
// token, one for other filters, or garbage is 400 INVALID_COMMAND, and
// ListPolicies' token is refused by ListDebts.
func TestListPoliciesRefusesTokensItDidNotIssue(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	h.ok("PublishPolicy", anySubjectPolicy, adminToken)
	for _, subject := range []string{"tenant-a/u1", "tenant-b/u1"} {
		h.ok("Reserve", `{"reservationId":"`+subject+`","subject":"`+subject+`","route":"chat.generate","units":{"tokens":10}}`, adminToken)
		h.ok("Start", `{"reservationId":"`+subject+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+subject+`","operationId":"op","actualUnits":{"tokens":2000}}`, adminToken)
		h.ok("PublishPolicy", policyBodyFor(subject, "chat.generate", 50), adminToken)
	}
	debtsNext, _ := h.ok("ListDebts", `{"pageSize":1}`, adminToken)["nextPageToken"].(string)
	policiesNext, _ := h.ok("ListPolicies", `{"pageSize":1}`, adminToken)["nextPageToken"].(string)
	if debtsNext == "" || policiesNext == "" {
		t.Fatalf("no next page tokens: %q, %q", debtsNext, policiesNext)
	}
	handBuilt := base64.RawURLEncoding.EncodeToString([]byte("1/" + strings.Repeat("0", 16)))
	notIssued := "pageToken: not a nextPageToken this server issued"
	for _, c := range []struct{ method, body, token, message string }{
		{"ListPolicies", `{"pageSize":1,"pageToken":"` + debtsNext + `"}`, adminToken, notIssued},
		{"ListDebts", `{"pageSize":1,"pageToken":"` + policiesNext + `"}`, adminToken, notIssued},
		{"ListPolicies", `{"pageSize":1,"pageToken":"` + handBuilt + `"}`, adminToken, notIssued},
		{"ListPolicies", `{"pageSize":1,"pageToken":"` + policiesNext + `"}`, consoleViewer, notIssued},
		{"ListPolicies", `{"pageSize":1,"pageToken":"%%%"}`, adminToken, notIssued},
		{"ListPolicies", `{"pageSize":1,"pageToken":"p1.AAAA"}`, adminToken, notIssued},
		{"ListPolicies", `{"pageSize":1,"route":"chat.generate","pageToken":"` + policiesNext + `"}`, adminToken,
			"pageToken: issued for another subject, route or region filter"},
	} {
		r := h.call(c.method, c.body, c.token)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
		if msg, _ := r.body["message"].(string); !strings.HasPrefix(msg, c.message) {
			t.Errorf("%s %s: message %q, want it to begin %q", c.method, c.body, msg, c.message)
		}
	}
	// Its own token, with its filters, continues.
	if got := h.ok("ListPolicies", `{"pageSize":1,"pageToken":"`+policiesNext+`"}`, adminToken)["policies"].([]any); len(got) != 1 {
		t.Fatalf("the second page: %v", got)
	}
}

// Without a tokens file a token is a plain position: one that is not
// ListPolicies' (malformed, generation 0 or beyond any stored, another
// method's shape, other filters) is still 400 INVALID_COMMAND.
func TestListPoliciesRefusesForgedPlainTokens(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", policyBodyFor("tenant-a", "chat", 10), "")
	h.ok("PublishPolicy", policyBodyFor("tenant-b", "chat", 10), "")
	next, _ := h.ok("ListPolicies", `{"pageSize":1}`, "")["nextPageToken"].(string)
	raw, err := base64.RawURLEncoding.DecodeString(next)
	if err != nil || !strings.HasPrefix(string(raw), "1/") {
		t.Fatalf("the plain token of the first page: %q (%q, %v)", next, raw, err)
	}
	digest := strings.TrimPrefix(string(raw), "1/")
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, token := range []string{"%%%", "p1.AAAA", enc("0/" + digest), enc("-1/" + digest), enc("9223372036854775808/" + digest),
		enc("x/" + digest), enc("1/" + digest + "0"), enc("1"), enc("1/" + digest + "/r-1"), `WyJhIiwiciIsImciLDFd`} {
		r := h.call("ListPolicies", `{"pageSize":1,"pageToken":"`+token+`"}`, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
		if msg, _ := r.body["message"].(string); !strings.HasPrefix(msg, "pageToken: not a nextPageToken") {
			t.Errorf("token %q: message %q", token, msg)
		}
	}
	r := h.call("ListPolicies", `{"pageSize":1,"subject":"tenant-a","pageToken":"`+next+`"}`, "")
	h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
	if msg, _ := r.body["message"].(string); !strings.HasPrefix(msg, "pageToken: issued for another subject, route or region filter") {
		t.Errorf("another filter's token: message %q", msg)
	}
	if got := h.ok("ListPolicies", `{"pageSize":1,"pageToken":"`+enc("1/"+digest)+`"}`, "")["policies"].([]any); len(got) != 1 {
		t.Fatalf("the plain token rebuilt: %v", got)
	}
}

// policyPageCounting counts the policy rows the engine's page reads
// return.
type policyPageCounting struct {
	store.Store
	rows atomic.Int64
}

func (s *policyPageCounting) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	rows, err := s.Store.PolicyPage(ctx, f)
	s.rows.Add(int64(len(rows)))
	return rows, err
}

// A scoped token's pages hold only the policies its scope covers (its
// subjects' on its routes, and the wildcard "*" policies of its routes),
// each exactly once, however many other tenants' policies lie between:
// a call reads at most 8 store pages of pageSize rows, so a page may be
// short or empty while nextPageToken is set, and its tokens are sealed
// (they name no generation). A subject or route filter the scope cannot
// match answers no policies and no token without reading.
func TestListPoliciesScopedPagesShowOnlyTheScope(t *testing.T) {
	var counting *policyPageCounting
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, wrapStore: func(st store.Store) store.Store {
		counting = &policyPageCounting{Store: st}
		return counting
	}})
	type pub struct{ subject, route string }
	var published []pub
	publish := func(subject, route string) {
		h.ok("PublishPolicy", policyBodyFor(subject, route, 10+len(published)), adminToken)
		published = append(published, pub{subject, route})
	}
	for i := range 60 {
		publish(fmt.Sprintf("tenant-c/u%d", i), "chat.generate")
		switch i % 12 {
		case 3:
			publish(fmt.Sprintf("tenant-a/u%d", i), "chat.generate")
			publish(fmt.Sprintf("tenant-a/u%d", i), "embed") // outside gw-a's routes
		case 7:
			publish(fmt.Sprintf("tenant-b/u%d", i), "embed")
		case 11:
			publish("*", []string{"chat.generate", "embed"}[i%2])
		}
	}
	publish("*", "chat.generate")
	for _, c := range []struct {
		name, token string
		covers      func(pub) bool
	}{
		{"gw-a subjects=tenant-a/* routes=chat.*", gwAToken, func(p pub) bool {
			return strings.HasPrefix(p.route, "chat.") && (p.subject == "*" || strings.HasPrefix(p.subject, "tenant-a/"))
		}},
		{"viewer subjects=tenant-b/*", viewerToken, func(p pub) bool { return p.subject == "*" || strings.HasPrefix(p.subject, "tenant-b/") }},
		{"admin", adminToken, func(pub) bool { return true }},
	} {
		var want []uint64
		for i, p := range published {
			if c.covers(p) {
				want = append(want, uint64(i+1))
			}
		}
		for _, size := range []int{1, 2, 5, 0} {
			policies, sizes := policyPages(t, h, `{}`, size, c.token)
			if got := generationsOf(policies); !slices.Equal(got, want) {
				t.Fatalf("%s, pages of %d: generations %v, want %v", c.name, size, got, want)
			}
			if c.token != adminToken && size == 1 && !slices.Contains(sizes, 0) {
				t.Errorf("%s, pages of 1: sizes %v, want some empty page with a token (a bounded read)", c.name, sizes)
			}
		}
		// A sealed token names no generation.
		page := h.ok("ListPolicies", `{"pageSize":1}`, c.token)
		next, _ := page["nextPageToken"].(string)
		if !strings.HasPrefix(next, "p1.") {
			t.Errorf("%s: next page token %q is not sealed", c.name, next)
		}
	}
	// A bounded read per call: at most 8 store pages of pageSize (+1) rows.
	before := counting.rows.Load()
	h.ok("ListPolicies", `{"pageSize":1}`, viewerToken)
	if n := counting.rows.Load() - before; n > 8*2 {
		t.Errorf("one scoped call of pageSize 1 read %d policy rows, want at most 16", n)
	}
	// Filters the scope cannot match: nothing, and nothing read.
	before = counting.rows.Load()
	for _, body := range []string{`{"subject":"tenant-c/u1"}`, `{"subject":"tenant-a/u3","route":"embed"}`} {
		for _, token := range []string{gwAToken, viewerToken} {
			if body == `{"subject":"tenant-a/u3","route":"embed"}` && token == viewerToken {
				continue
			}
			page := h.ok("ListPolicies", body, token)
			if len(page) != 0 {
				t.Errorf("%s for a token that cannot see it: %v, want an empty answer", body, page)
			}
		}
	}
	if n := counting.rows.Load() - before; n != 0 {
		t.Errorf("filters outside the scope read %d policy rows, want none", n)
	}
	// The wildcard subject's policies of its routes, by filter.
	stars, _ := policyPages(t, h, `{"subject":"*"}`, 1, gwAToken)
	for _, p := range stars {
		if p["subject"] != "*" || p["route"] != "chat.generate" {
			t.Errorf("gw-a's \"*\" policies: %v", p)
		}
	}
	if len(stars) == 0 {
		t.Errorf("gw-a sees no \"*\" policy of chat.generate")
	}
}
