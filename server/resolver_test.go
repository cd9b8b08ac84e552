package server_test

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
)

func TestOverdueUnknownAreListedFirstAndCounted(t *testing.T) {
	// u-young's route deadline is 1 minute, the others' 1 hour: the
	// younger one is overdue first.
	deadline := func(r *ledger.Reservation) time.Duration {
		if r.ID == "u-young" {
			return time.Minute
		}
		return time.Hour
	}
	h := newHarness(t, harnessOptions{resolver: &engine.ResolverOptions{Deadline: deadline}})
	h.ok("PublishPolicy", tokensPolicy, "")
	for _, id := range []string{"u-old", "u-mid", "u-young"} {
		h.startWork(id)
		h.markUnknown(id)
		h.clock.Advance(time.Second)
	}
	metrics := h.get("/metrics")
	if strings.Contains(metrics, "capledger_usage_unknown_overdue ") {
		t.Fatalf("overdue gauge before the resolver's first scan:\n%s", grep(metrics, "overdue"))
	}
	// Nor does the API count them as 0 overdue: it says no scan happened
	// (the console's card says "not scanned yet").
	if page := h.ok("ListUsageUnknown", `{}`, ""); page["resolverConfigured"] != true || page["resolverScanned"] != nil || page["overdue"] != nil {
		t.Fatalf("before the first scan: resolverConfigured %v, resolverScanned %v, overdue %v; want true, absent, absent",
			page["resolverConfigured"], page["resolverScanned"], page["overdue"])
	}
	h.engine.RunResolver(context.Background())
	if metrics = h.get("/metrics"); !strings.Contains(metrics, "capledger_usage_unknown_overdue 0\n") {
		t.Fatalf("nothing overdue yet:\n%s", grep(metrics, "overdue"))
	}
	page := h.ok("ListUsageUnknown", `{}`, "")
	if got := ids(t, page); !slices.Equal(got, []string{"u-old", "u-mid", "u-young"}) || page["overdueReservationIds"] != nil {
		t.Fatalf("before any deadline: %v %v", got, page["overdueReservationIds"])
	}
	// Nothing overdue, but the deadlines are there: the console tells
	// this 0 from a server without a resolver (TestListUsageUnknown).
	if page["resolverConfigured"] != true || page["resolverScanned"] != true {
		t.Errorf("resolverConfigured %v, resolverScanned %v with serve --resolver-config after a scan", page["resolverConfigured"], page["resolverScanned"])
	}

	h.clock.Advance(2 * time.Minute)
	h.engine.RunResolver(context.Background())
	page = h.ok("ListUsageUnknown", `{}`, "")
	if got := ids(t, page); !slices.Equal(got, []string{"u-young", "u-old", "u-mid"}) {
		t.Fatalf("page %v, want the overdue u-young first, then oldest first", got)
	}
	if overdue, _ := page["overdueReservationIds"].([]any); len(overdue) != 1 || overdue[0] != "u-young" || page["overdue"] != "1" {
		t.Fatalf("overdue fields: %v %v", page["overdueReservationIds"], page["overdue"])
	}
	if metrics = h.get("/metrics"); !strings.Contains(metrics, "capledger_usage_unknown_overdue 1\n") {
		t.Fatalf("one overdue:\n%s", grep(metrics, "overdue"))
	}
	// Paging still follows the store's order: a page of two ends at
	// u-mid, and the next holds u-young (overdue, so flagged) alone.
	page = h.ok("ListUsageUnknown", `{"pageSize":2}`, "")
	if got := ids(t, page); !slices.Equal(got, []string{"u-old", "u-mid"}) || page["overdueReservationIds"] != nil {
		t.Fatalf("first page of two: %v %v", got, page["overdueReservationIds"])
	}
	next := h.ok("ListUsageUnknown", `{"pageSize":2,"pageToken":"`+page["nextPageToken"].(string)+`"}`, "")
	if got := ids(t, next); !slices.Equal(got, []string{"u-young"}) || next["overdueReservationIds"] == nil {
		t.Fatalf("second page: %v %v", got, next["overdueReservationIds"])
	}
}

// A scoped token's ListUsageUnknown names no overdue reservation outside
// its scope and gives no store-wide overdue count, as it gives no
// store-wide backlog (docs/API.md, scopes; the console's Backlog page).
func TestOverdueUnknownStayInScope(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens,
		resolver: &engine.ResolverOptions{Deadline: func(*ledger.Reservation) time.Duration { return time.Minute }}})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	h.ok("Reserve", reserveFor("a-unknown", "tenant-a/u1", 10), adminToken)
	h.ok("Start", `{"reservationId":"a-unknown","operationId":"op"}`, adminToken)
	h.ok("MarkUsageUnknown", `{"reservationId":"a-unknown"}`, adminToken)
	h.clock.Advance(2 * time.Minute)
	h.engine.RunResolver(context.Background())

	all := h.ok("ListUsageUnknown", `{}`, consoleViewer)
	if overdue, _ := all["overdueReservationIds"].([]any); len(overdue) != 1 || overdue[0] != "a-unknown" || all["overdue"] != "1" {
		t.Fatalf("unscoped viewer: %v", all)
	}
	scoped := h.ok("ListUsageUnknown", `{}`, consoleScoped)
	if scoped["reservations"] != nil || scoped["overdueReservationIds"] != nil || scoped["overdue"] != nil || scoped["backlog"] != nil {
		t.Errorf("a token scoped to tenant-b/* is told of tenant-a's backlog: %v", scoped)
	}
}

// A scoped token's pages of ListUsageUnknown skip the rows outside its
// scope and its page tokens never name one (an unscoped caller's are
// base64 of a cursor anybody can decode; a scoped one's are sealed): the
// next page after tenant-b's oldest holds its next one, and no token
// names tenant-a's reservation.
func TestUnknownPagesOfAScopedTokenNameOnlyItsRows(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	for _, r := range []struct{ id, subject string }{{"b-old", "tenant-b/u1"}, {"a-mid", "tenant-a/u1"}, {"b-young", "tenant-b/u1"}} {
		h.ok("Reserve", reserveFor(r.id, r.subject, 10), adminToken)
		h.ok("Start", `{"reservationId":"`+r.id+`","operationId":"op"}`, adminToken)
		h.ok("MarkUsageUnknown", `{"reservationId":"`+r.id+`"}`, adminToken)
		h.clock.Advance(time.Second)
	}
	var got []string
	token := ""
	for range 4 {
		page := h.ok("ListUsageUnknown", `{"pageSize":1,"pageToken":"`+token+`"}`, consoleScoped)
		got = append(got, ids(t, page)...)
		token, _ = page["nextPageToken"].(string)
		raw, _ := base64.RawURLEncoding.DecodeString(token)
		if strings.Contains(string(raw), "a-mid") {
			t.Fatalf("a tenant-b/* token's page token names tenant-a's a-mid: %q", raw)
		}
		if token == "" {
			break
		}
	}
	if !slices.Equal(got, []string{"b-old", "b-young"}) {
		t.Errorf("pages of one for tenant-b/*: %v, want b-old then b-young", got)
	}
}
