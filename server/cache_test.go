package server_test

import (
	"net/http"
	"net/url"
	"testing"
)

// A Connect GET reads live state, so its answer says no cache may keep it:
// a GetReservation replayed by a proxy after a lost Reserve would show the
// reservation as it was (or a 404 from before it landed). POST answers,
// which HTTP caches do not keep, carry no such header.
func TestConnectGetAnswersAreNotStored(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("r-1", 100), "")
	get := func(path, message string) response {
		t.Helper()
		return h.do(mustRequest(t, http.MethodGet, h.url+path+"?encoding=json&message="+url.QueryEscape(message)))
	}
	for _, c := range []struct {
		path, message string
		status        int
	}{
		{"/capledger.v1.LedgerService/GetReservation", `{"reservationId":"r-1"}`, http.StatusOK},
		{"/capledger.v1.LedgerService/GetReservation", `{"reservationId":"not-yet"}`, http.StatusNotFound},
		{"/capledger.v1.LedgerService/GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, http.StatusOK},
		{"/capledger.v1.LedgerService/ListPolicies", `{}`, http.StatusOK},
		{"/capledger.v1.ConsoleService/GetOverview", `{}`, http.StatusOK},
	} {
		r := get(c.path, c.message)
		if r.status != c.status || r.header.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s %s: %d, Cache-Control %q; want %d, no-store: %s", c.path, c.message, r.status, r.header.Get("Cache-Control"), c.status, r.raw)
		}
	}
	if r := h.call("GetReservation", `{"reservationId":"r-1"}`, ""); r.status != http.StatusOK || r.header.Get("Cache-Control") != "" {
		t.Errorf("POST GetReservation: %d, Cache-Control %q", r.status, r.header.Get("Cache-Control"))
	}
}
