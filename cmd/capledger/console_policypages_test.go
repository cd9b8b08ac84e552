package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// The Policies page shows ListPolicies a page of 100 generations at a
// time, oldest first, with "next" and "previous" following the API's page
// tokens: 130 generations are pages of 100 and 30, each generation once.
// A scoped token's pages hold only its tenant's generations, and a token
// change starts again at the first page (a page token is bound to the
// token it was issued to).
func TestConsoleBrowserPoliciesPages(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t, "--tokens", writeConsoleTokens(t))
	const n = 130
	var tenantA []uint64
	for i := range n {
		subject := fmt.Sprintf("tenant-x%03d", i)
		if i%10 == 4 {
			subject = "tenant-a" // a new generation of tenant-a each time
		}
		var resp v1.PublishPolicyResponse
		mustCall(t, base, consoleAdminToken, "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate",
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: int64(100 + i)}},
			HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &resp)
		if resp.Policy.GetGeneration() != uint64(i+1) {
			t.Fatalf("publish %d: generation %d", i, resp.Policy.GetGeneration())
		}
		if subject == "tenant-a" {
			tenantA = append(tenantA, uint64(i+1))
		}
	}

	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#policies"))
	b.do(chromedp.WaitVisible(`main[data-failed]`))
	b.setToken(consoleAdminToken)
	b.waitRendered("policies")
	// shows checks the page lists exactly generations (in order), its
	// number, and which of previous and next it offers.
	shows := func(page string, generations []uint64, prev, next bool) {
		t.Helper()
		var want []string
		for _, g := range generations {
			want = append(want, fmt.Sprintf("g%d", g))
		}
		got := b.eval(`Array.from(document.querySelectorAll('main tbody tr[data-key^="g"]')).map((r) => r.dataset.key).join(" ")`)
		if got != strings.Join(want, " ") {
			t.Errorf("page %s lists %s, want %s", page, got, strings.Join(want, " "))
		}
		b.want(`[data-value="pol-page"]`, page)
		for id, on := range map[string]bool{"pol-prev": prev, "pol-next": next} {
			if disabled := b.eval(`String(document.getElementById("` + id + `").disabled)`); disabled != fmt.Sprint(!on) {
				t.Errorf("page %s: %s disabled %s, want %v", page, id, disabled, !on)
			}
		}
	}
	click := func(id string) {
		t.Helper()
		b.unready()
		b.eval(`(() => { document.getElementById("` + id + `").click(); return ""; })()`)
		b.waitRendered("policies")
	}
	upTo := func(from, to uint64) []uint64 {
		var out []uint64
		for g := from; g <= to; g++ {
			out = append(out, g)
		}
		return out
	}
	shows("1", upTo(1, 100), false, true)
	click("pol-next")
	shows("2", upTo(101, n), true, false)
	b.screenshot("policies-page-2")
	click("pol-prev")
	shows("1", upTo(1, 100), false, true)
	click("pol-next")
	shows("2", upTo(101, n), true, false)

	// Another token: the first page again, of its own generations.
	b.setToken(consoleScopedToken)
	b.waitRendered("policies")
	shows("1", tenantA, false, false)
	if body := b.eval(`document.querySelector("main tbody").innerText`); strings.Contains(body, "tenant-x") {
		t.Errorf("a tenant-a token's Policies page shows another tenant:\n%s", body)
	}
	b.noConsoleErrors(true)
}
