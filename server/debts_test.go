package server_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/server"
)

const anySubjectPolicy = `{"policy":{"subject":"*","route":"chat.generate",
  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"100","refillInterval":"1s"}],
  "holdTtl":"30s"}}`

// owe leaves subject owing debt of actual − 1000 tokens: it reserves the
// whole burst in two holds and settles the first with actual.
func (h *harness) owe(subject string, actual int) {
	h.t.Helper()
	reserve := func(id string, n int) {
		h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"chat.generate","units":{"tokens":%d}}`, id, subject, n), "")
	}
	reserve(subject+"-a", 600)
	reserve(subject+"-b", 400)
	h.ok("Start", fmt.Sprintf(`{"reservationId":"%s-a","operationId":"op"}`, subject), "")
	h.ok("Settle", fmt.Sprintf(`{"reservationId":"%s-a","operationId":"op","actualUnits":{"tokens":%d}}`, subject, actual), "")
}

// debtors returns "subject:debt" of each listed account.
func debtors(t *testing.T, page map[string]any) []string {
	t.Helper()
	var out []string
	list, _ := page["accounts"].([]any)
	for _, a := range list {
		m := a.(map[string]any)
		if m["frozen"] != true {
			t.Fatalf("listed an account that is not frozen: %v", m)
		}
		out = append(out, fmt.Sprintf("%s:%d", m["subject"], num(m["balances"].([]any)[0].(map[string]any)["debt"])))
	}
	return out
}

func TestListDebts(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", anySubjectPolicy, "")
	if empty := h.ok("ListDebts", `{}`, ""); len(empty) != 0 {
		t.Fatalf("no debt yet: %v", empty)
	}
	h.owe("t-1", 900)  // owes 300
	h.owe("t-2", 1300) // owes 700
	h.owe("t-3", 900)  // owes 300
	h.ok("Reserve", `{"reservationId":"t-4-a","subject":"t-4","route":"chat.generate","units":{"tokens":600}}`, "")

	var all []string
	token := ""
	for pages := 0; ; pages++ {
		got := h.ok("ListDebts", fmt.Sprintf(`{"pageSize":2,"pageToken":%q}`, token), "")
		all = append(all, debtors(t, got)...)
		next, _ := got["nextPageToken"].(string)
		if next == "" {
			break
		}
		if pages > 3 {
			t.Fatalf("more pages than debtors: %v", all)
		}
		token = next
	}
	if want := "t-1:300 t-2:700 t-3:300"; strings.Join(all, " ") != want {
		t.Fatalf("debtors %v, want %s", all, want)
	}

	// Refill repays debt first: 3 s of 100 tokens repay 300, so t-1 and
	// t-3 owe nothing as of now, though their stored rows still show the
	// debt until their next command.
	h.clock.Advance(3 * time.Second)
	if got := debtors(t, h.ok("ListDebts", `{"pageSize":1}`, "")); strings.Join(got, " ") != "t-2:400" {
		t.Fatalf("after 3 s of refill: %v, want only t-2:400", got)
	}
	h.clock.Advance(4 * time.Second)
	if after := h.ok("ListDebts", `{}`, ""); len(debtors(t, after)) != 0 || after["nextPageToken"] != nil {
		t.Fatalf("after the debt is repaid: %v", after)
	}
}

func TestListDebtsRefusesBadPages(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	for _, body := range []string{
		`{"pageSize":1001}`,
		`{"pageSize":-5}`,
		`{"pageToken":"%%%"}`,
		`{"pageToken":"WyJhIl0"}`,                // ["a"]: too short
		`{"pageToken":"WyIiLCJyIiwiZyIsMV0"}`,    // ["","r","g",1]: no subject
		`{"pageToken":"WyJhIiwiciIsImciLC0xXQ"}`, // ["a","r","g",-1]: negative generation
		// ["a","r","g",9223372036854775808]: a generation no store holds
		`{"pageToken":"WyJhIiwiciIsImciLDkyMjMzNzIwMzY4NTQ3NzU4MDhd"}`,
	} {
		h.wantError(h.call("ListDebts", body, adminToken), http.StatusBadRequest, "invalid_argument", "")
	}
	// Debtors span every tenant: admin only.
	h.wantError(h.call("ListDebts", `{}`, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.ok("ListDebts", `{}`, adminToken)
}

// A scoped token's pages of ListDebts skip the accounts outside its scope
// and its page tokens never name one (an unscoped caller's are base64 of
// an account key anybody can decode; a scoped one's are sealed): pages of
// one for tenant-b/* hold its two debtors, and no token names tenant-a's
// or tenant-c's account.
func TestDebtPagesOfAScopedTokenNameOnlyItsAccounts(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s","maxOverdraft":"1000"}]}}`, adminToken)
	for i, subject := range []string{"tenant-a/u1", "tenant-b/u1", "tenant-b/u2", "tenant-c/u1"} {
		id := fmt.Sprintf("d%d", i)
		h.ok("Reserve", reserveFor(id, subject, 50), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+id+`","operationId":"op","actualUnits":{"tokens":200}}`, adminToken)
	}
	var got []string
	token := ""
	for range 5 {
		page := h.ok("ListDebts", `{"pageSize":1,"pageToken":"`+token+`"}`, consoleScoped)
		accounts, _ := page["accounts"].([]any)
		for _, a := range accounts {
			got = append(got, a.(map[string]any)["subject"].(string))
		}
		token, _ = page["nextPageToken"].(string)
		raw, _ := base64.RawURLEncoding.DecodeString(token)
		if strings.Contains(string(raw), "tenant-a") || strings.Contains(string(raw), "tenant-c") {
			t.Fatalf("a tenant-b/* token's page token names another tenant's account: %q", raw)
		}
		if token == "" {
			break
		}
	}
	if !slices.Equal(got, []string{"tenant-b/u1", "tenant-b/u2"}) {
		t.Errorf("pages of one for tenant-b/*: %v, want tenant-b/u1 then tenant-b/u2", got)
	}
}

// Without a tokens file a ListDebts token is a plain position, so a
// caller can hand-build one. One whose subject, route or region no
// account key can hold (a NUL byte, which PostgreSQL refuses, or more
// than 512 bytes) is refused as not a token of ListDebts, on every store:
// PostgreSQL answered the NUL byte 503 STORE_UNAVAILABLE, a "retry" that
// fails the same way forever, while SQLite read on from it.
func TestListDebtsRefusesACursorNoAccountKeyHolds(t *testing.T) {
	stores := map[string]harnessOptions{"sqlite": {}, "postgres": {postgres: true}}
	for name, opts := range stores {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, opts)
			h.ok("PublishPolicy", anySubjectPolicy, "")
			h.owe("t-1", 900)
			for _, key := range []string{`["t\u0000","chat.generate","global",1]`, `["t-1","chat\u0000","global",1]`,
				`["t-1","chat.generate","glo\u0000bal",1]`, `["` + strings.Repeat("t", 513) + `","chat.generate","global",1]`} {
				body := `{"pageToken":"` + base64.RawURLEncoding.EncodeToString([]byte(key)) + `"}`
				r := h.call("ListDebts", body, "")
				h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
				if message, _ := r.body["message"].(string); !strings.Contains(message, "not a nextPageToken of ListDebts") {
					t.Errorf("cursor %.40s: %s", key, r.raw)
				}
			}
			// A position between keys is still a position: an empty page.
			body := `{"pageToken":"` + base64.RawURLEncoding.EncodeToString([]byte(`["t-2","chat.generate","global",1]`)) + `"}`
			if page := h.ok("ListDebts", body, ""); len(page) != 0 {
				t.Errorf("after the last debtor: %v", page)
			}
		})
	}
}
