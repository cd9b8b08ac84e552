package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// A tenant page's reservations list pages with the API's page tokens;
// a token change starts every subject's list again at its newest page
// (a page token is bound to the token it was issued to: the old one's
// would be refused, 400 "pageToken: not a nextPageToken this server
// issued").
func TestConsoleBrowserSubjectReservationPagesStartAgainForANewToken(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t, "--tokens", writeConsoleTokens(t))
	mustCall(t, base, consoleAdminToken, "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-a", Route: "chat.generate",
		Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100000}},
		HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
	}}, &v1.PublishPolicyResponse{})
	for i := range 25 {
		mustCall(t, base, consoleAdminToken, "LedgerService/Reserve", &v1.ReserveRequest{
			ReservationId: fmt.Sprintf("r-%02d", i), Subject: "tenant-a", Route: "chat.generate", Units: map[string]int64{"tokens": 1},
		}, &v1.ReserveResponse{})
	}

	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#tenants"))
	b.do(chromedp.WaitVisible(`main[data-failed]`))
	b.setToken(consoleAdminToken)
	b.waitRendered("tenants")
	const page = "tenants/tenant-a/chat.generate/global"
	b.open(page)
	shows := func(pageNo string, rows int) {
		t.Helper()
		if n := b.count(`tr[data-key^="res/"]`); n != rows {
			t.Errorf("page %s lists %d reservations, want %d", pageNo, n, rows)
		}
		b.want(`[data-value="res-page"]`, pageNo)
	}
	shows("1", 20)
	b.unready()
	b.eval(`(() => { document.getElementById("res-older").click(); return ""; })()`)
	b.waitRendered(page)
	shows("2", 5)

	// Another token (the viewer's, reading the same subject): its list
	// starts again at the newest page.
	b.setToken(consoleViewerToken)
	b.waitRendered(page)
	shows("1", 20)
	b.noConsoleErrors(true)
}
