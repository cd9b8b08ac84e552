package server_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/server"
)

// startWork reserves id on tenant-7's chat.generate and starts it, at
// the harness clock's current time.
func (h *harness) startWork(id string) {
	h.t.Helper()
	h.ok("Reserve", reserveBody(id, 10), "")
	h.ok("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id), "")
}

// markUnknown marks started work USAGE_UNKNOWN at the harness clock's
// current time.
func (h *harness) markUnknown(id string) {
	h.t.Helper()
	h.ok("MarkUsageUnknown", fmt.Sprintf(`{"reservationId":%q}`, id), "")
}

func ids(t *testing.T, page map[string]any) []string {
	t.Helper()
	var out []string
	list, _ := page["reservations"].([]any)
	for _, r := range list {
		m := r.(map[string]any)
		if m["state"] != "RESERVATION_STATE_USAGE_UNKNOWN" {
			t.Fatalf("listed a reservation in %v: %v", m["state"], m)
		}
		out = append(out, m["reservationId"].(string))
	}
	return out
}

func TestListUsageUnknown(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	// Without a resolver resolverConfigured is false (left out) too.
	empty := h.ok("ListUsageUnknown", `{}`, "")
	if len(empty) != 0 {
		t.Fatalf("empty backlog answered %v", empty)
	}
	// Started in the order u-e, u-d, u-b, u-a, u-c, a second apart, and
	// marked a minute later in another order: u-c, u-a, u-b a second
	// apart, then u-e and u-d at the same instant. The backlog is ordered
	// and aged by the marking. Work that is only started, settled or
	// reserved is not in it.
	started := h.clock.Now()
	for _, id := range []string{"u-e", "u-d", "u-b", "u-a", "u-c"} {
		h.startWork(id)
		h.clock.Advance(time.Second)
	}
	h.clock.Advance(time.Minute)
	first := h.clock.Now()
	for _, id := range []string{"u-c", "u-a", "u-b"} {
		h.markUnknown(id)
		h.clock.Advance(time.Second)
	}
	h.markUnknown("u-e")
	h.markUnknown("u-d")
	h.ok("Reserve", reserveBody("started", 10), "")
	h.ok("Start", `{"reservationId":"started","operationId":"op-started"}`, "")
	h.ok("Reserve", reserveBody("reserved", 10), "")

	var all []string
	token := ""
	for page := 0; ; page++ {
		if page == 5 {
			t.Fatalf("still paging after %d pages: %v (does the token move on?)", page, all)
		}
		got := h.ok("ListUsageUnknown", fmt.Sprintf(`{"pageSize":2,"pageToken":%q}`, token), "")
		if num(got["backlog"]) != 5 || got["oldestUsageUnknownAt"] != first.Format(time.RFC3339) {
			t.Fatalf("page %d: backlog %v oldest %v, want 5 and %s", page, got["backlog"], got["oldestUsageUnknownAt"], first.Format(time.RFC3339))
		}
		if page == 0 {
			// Each reservation says when it started and when it was marked.
			r := got["reservations"].([]any)[0].(map[string]any)
			if r["startedAt"] != started.Add(4*time.Second).Format(time.RFC3339) || r["usageUnknownAt"] != first.Format(time.RFC3339) {
				t.Fatalf("u-c started at %v, marked at %v; want %s and %s", r["startedAt"], r["usageUnknownAt"],
					started.Add(4*time.Second).Format(time.RFC3339), first.Format(time.RFC3339))
			}
		}
		all = append(all, ids(t, got)...)
		next, _ := got["nextPageToken"].(string)
		if next == "" {
			break
		}
		token = next
	}
	if want := "u-c u-a u-b u-d u-e"; strings.Join(all, " ") != want {
		t.Fatalf("pages listed %v, want %s (earliest marked first, ids break ties)", all, want)
	}

	// Filters narrow the list, not the backlog count.
	other := h.ok("ListUsageUnknown", `{"route":"embed.create"}`, "")
	if len(ids(t, other)) != 0 || num(other["backlog"]) != 5 {
		t.Fatalf("another route: %v", other)
	}
	mine := h.ok("ListUsageUnknown", `{"subject":"tenant-7","route":"chat.generate","pageSize":1000}`, "")
	if len(ids(t, mine)) != 5 || mine["nextPageToken"] != nil {
		t.Fatalf("tenant-7's backlog in one page: %v", mine)
	}

	// A settle with the operation receipt resolves one.
	h.ok("Settle", `{"reservationId":"u-c","operationId":"op-u-c","actualUnits":{"tokens":4,"requests":1}}`, "")
	after := h.ok("ListUsageUnknown", `{}`, "")
	if got := ids(t, after); strings.Join(got, " ") != "u-a u-b u-d u-e" || num(after["backlog"]) != 4 ||
		after["oldestUsageUnknownAt"] != first.Add(time.Second).Format(time.RFC3339) {
		t.Fatalf("after settling u-c: %v", after)
	}
}

func TestListUsageUnknownRefusesBadPages(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	for _, body := range []string{
		`{"pageSize":1001}`,
		`{"pageSize":-1}`,
		`{"pageToken":"not base64 !"}`,
		`{"pageToken":"` + "bm8tc2xhc2g" + `"}`, // base64url of "no-slash"
		`{"pageToken":"` + "eHl6L2lk" + `"}`,    // "xyz/id": no time
		`{"pageToken":"` + "MC9pZA" + `"}`,      // "0/id": the epoch, which no marking time stores as
		`{"pageSize":"many"}`,
	} {
		r := h.call("ListUsageUnknown", body, adminToken)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "")
	}
	// The backlog lists every tenant's work: admin only.
	h.wantError(h.call("ListUsageUnknown", `{}`, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.ok("ListUsageUnknown", `{}`, adminToken)
}

func TestUsageUnknownMetrics(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	metrics := h.get("/metrics")
	for _, want := range []string{"capledger_usage_unknown_reservations 0", "capledger_usage_unknown_oldest_age_seconds 0"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Fatalf("empty ledger: metrics lack %q:\n%s", want, grep(metrics, "usage_unknown"))
		}
	}
	// u-1 started first, but u-2 was marked first: the age is u-2's,
	// counted from its marking, not from either start.
	h.startWork("u-1")
	h.clock.Advance(30 * time.Second)
	h.startWork("u-2")
	h.clock.Advance(20 * time.Second)
	h.markUnknown("u-2")
	h.clock.Advance(30 * time.Second)
	h.markUnknown("u-1")
	h.clock.Advance(10 * time.Second) // also past the 5 s the gauges cache a reading
	metrics = h.get("/metrics")
	for _, want := range []string{"capledger_usage_unknown_reservations 2", "capledger_usage_unknown_oldest_age_seconds 40"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Fatalf("two unknowns, the earlier marked 40 s ago: metrics lack %q:\n%s", want, grep(metrics, "usage_unknown"))
		}
	}
	// Within the cache period a scrape reuses the reading (the count) but
	// measures the age against now.
	h.ok("Settle", `{"reservationId":"u-2","operationId":"op-u-2","actualUnits":{"tokens":1,"requests":1}}`, "")
	h.clock.Advance(2 * time.Second)
	metrics = h.get("/metrics")
	if !strings.Contains(metrics, "capledger_usage_unknown_reservations 2\n") || !strings.Contains(metrics, "capledger_usage_unknown_oldest_age_seconds 42\n") {
		t.Fatalf("cached reading: %s", grep(metrics, "usage_unknown"))
	}
	h.clock.Advance(5 * time.Second)
	metrics = h.get("/metrics")
	for _, want := range []string{"capledger_usage_unknown_reservations 1", "capledger_usage_unknown_oldest_age_seconds 17"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Fatalf("after settling u-2: metrics lack %q:\n%s", want, grep(metrics, "usage_unknown"))
		}
	}
}

// A ListUsageUnknown page token is a marking time and an id: it belongs to
// the subject and route filters it was issued for, and is refused (400
// INVALID_COMMAND, the message says why) with others, rather than paging
// another filter's backlog from a foreign position (API.md).
func TestListUsageUnknownTokenBoundToFilters(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	for _, id := range []string{"u-a", "u-b", "u-c"} {
		h.startWork(id)
		h.markUnknown(id)
		h.clock.Advance(time.Second)
	}
	first := h.ok("ListUsageUnknown", `{"route":"chat.generate","pageSize":1}`, "")
	token, _ := first["nextPageToken"].(string)
	if token == "" {
		t.Fatalf("no next page: %v", first)
	}
	if got := ids(t, h.ok("ListUsageUnknown", `{"route":"chat.generate","pageSize":1,"pageToken":"`+token+`"}`, "")); strings.Join(got, " ") != "u-b" {
		t.Errorf("its own filter's second page: %v", got)
	}
	for _, body := range []string{
		`{"pageSize":1,"pageToken":"` + token + `"}`,
		`{"route":"embed.create","pageSize":1,"pageToken":"` + token + `"}`,
		`{"subject":"tenant-7","route":"chat.generate","pageSize":1,"pageToken":"` + token + `"}`,
	} {
		r := h.call("ListUsageUnknown", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "another subject or route filter") {
			t.Errorf("%s: message %q does not say the token is another filter's", body, msg)
		}
	}
}

// An unscoped caller's ListUsageUnknown page token was the plain cursor
// in base64 (marking time, filters' digest, id), so one built by hand was
// accepted and paged from wherever it said, though API.md promises that a
// pageToken the method did not issue is refused. With a tokens file every
// caller's token is sealed now: the issued one pages on, a hand-built one
// (here exactly what the old server issued) is 400 INVALID_COMMAND.
func TestListUsageUnknownRefusesAHandBuiltToken(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	marked := h.clock.Now()
	for _, id := range []string{"u-a", "u-b", "u-c"} {
		h.ok("Reserve", reserveBody(id, 10), adminToken)
		h.ok("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id), adminToken)
		h.ok("MarkUsageUnknown", fmt.Sprintf(`{"reservationId":%q}`, id), adminToken)
	}
	first := h.ok("ListUsageUnknown", `{"pageSize":1}`, adminToken)
	token, _ := first["nextPageToken"].(string)
	if got := ids(t, first); token == "" || strings.Join(got, " ") != "u-a" {
		t.Fatalf("first page %v, token %q", got, token)
	}
	if got := ids(t, h.ok("ListUsageUnknown", `{"pageSize":1,"pageToken":"`+token+`"}`, adminToken)); strings.Join(got, " ") != "u-b" {
		t.Errorf("the issued token's page: %v", got)
	}
	// The cursor after u-b as the old server wrote it: the time of the
	// marking, the digest of the (empty) filters, the id.
	digest := sha256.New()
	digest.Write([]byte{0, 0})
	forged := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%d/%s/u-b", marked.UnixNano(), hex.EncodeToString(digest.Sum(nil)[:8]))))
	r := h.call("ListUsageUnknown", `{"pageSize":1,"pageToken":"`+forged+`"}`, adminToken)
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	if msg, _ := r.body["message"].(string); !strings.Contains(msg, "not a nextPageToken this server issued") {
		t.Errorf("a hand-built token: message %q", msg)
	}
}
