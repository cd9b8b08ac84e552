package server_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/capledger/capledger/server"
)

func recordBody(id, op string, tokens int) string {
	return fmt.Sprintf(`{"reservationId":%q,"operationId":%q,"subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":%d}}`, id, op, tokens)
}

// TestRecordUsageOverJSON: RecordUsage records usage nothing reserved,
// also on an empty or frozen account (as debt, SETTLED_WITH_DEBT), is
// idempotent under its id (a retry replays and charges nothing; other
// usage is RESERVATION_ALREADY_SETTLED; another subject or a Reserve's id
// is DIGEST_MISMATCH), and refuses what a reserve would refuse before the
// ledger (shape, unknown unit, no policy). The audit stays clean.
func TestRecordUsageOverJSON(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("held", 100), "")

	first := h.ok("RecordUsage", recordBody("r-1", "op-1", 1500), "")
	if field(first, "reservation", "state") != "RESERVATION_STATE_SETTLED_WITH_DEBT" || first["replayed"] != nil ||
		num(field(first, "reservation", "actualUnits", "tokens")) != 1500 ||
		num(field(first, "reservation", "overdraftUnits", "tokens")) != 600 || num(first["policyGeneration"]) != 1 ||
		!strings.HasPrefix(field(first, "reservation", "requestDigest").(string), "record:sha256:") {
		t.Fatalf("record of 1500 on 900 free: %v", first)
	}
	h.wantError(h.call("Reserve", reserveBody("after", 1), ""), http.StatusTooManyRequests, "resource_exhausted", server.ReasonAdmissionFrozen)
	// Frozen: still recorded, all of it debt.
	frozen := h.ok("RecordUsage", recordBody("r-2", "op-2", 100), "")
	if field(frozen, "reservation", "state") != "RESERVATION_STATE_SETTLED_WITH_DEBT" || num(field(frozen, "reservation", "overdraftUnits", "tokens")) != 100 {
		t.Fatalf("record while frozen: %v", frozen)
	}
	replay := h.ok("RecordUsage", recordBody("r-2", "op-2", 100), "")
	if replay["replayed"] != true || field(replay, "reservation", "createdAt") != field(frozen, "reservation", "createdAt") {
		t.Fatalf("retry: %v", replay)
	}
	acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	tokens := acct["accounts"].([]any)[0].(map[string]any)["balances"].([]any)[0].(map[string]any)
	if num(tokens["debt"]) != 700 || num(tokens["spent"]) != 1600 || num(tokens["reserved"]) != 100 {
		t.Fatalf("after the records and a retry: %v, want debt 700, spent 1600", tokens)
	}

	cases := []struct {
		name, method, body string
		status             int
		code, reason       string
	}{
		{"other usage", "RecordUsage", recordBody("r-2", "op-2", 101), http.StatusBadRequest, "failed_precondition", server.ReasonAlreadySettled},
		{"other operation", "RecordUsage", recordBody("r-2", "op-x", 100), http.StatusBadRequest, "failed_precondition", server.ReasonAlreadySettled},
		{"a reserve's id", "RecordUsage", recordBody("held", "op-h", 10), http.StatusConflict, "already_exists", server.ReasonDigestMismatch},
		{"another subject under the id (no policy for it)", "RecordUsage",
			`{"reservationId":"r-2","operationId":"op-2","subject":"tenant-9","route":"chat.generate","actualUnits":{"tokens":100}}`,
			http.StatusConflict, "already_exists", server.ReasonDigestMismatch},
		{"no operation", "RecordUsage", `{"reservationId":"x","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":1}}`,
			http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand},
		{"nothing used", "RecordUsage", recordBody("x", "op", 0), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand},
		{"negative", "RecordUsage", `{"reservationId":"x","operationId":"op","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":-1}}`,
			http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand},
		{"unknown unit", "RecordUsage", `{"reservationId":"x","operationId":"op","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokenz":1}}`,
			http.StatusBadRequest, "invalid_argument", server.ReasonUnknownUnit},
		{"no policy", "RecordUsage", `{"reservationId":"x","operationId":"op","subject":"tenant-9","route":"chat.generate","actualUnits":{"tokens":1}}`,
			http.StatusNotFound, "not_found", server.ReasonNoPolicy},
		{"a settle of the record with its usage replays", "Settle", `{"reservationId":"r-2","operationId":"op-2","actualUnits":{"tokens":100}}`, http.StatusOK, "", ""},
	}
	for _, tc := range cases {
		t.Logf("case: %s", tc.name)
		r := h.call(tc.method, tc.body, "")
		if tc.status == http.StatusOK {
			if r.status != http.StatusOK || r.body["replayed"] != true {
				t.Fatalf("%s: %d %s", tc.name, r.status, r.raw)
			}
			continue
		}
		h.wantError(r, tc.status, tc.code, tc.reason)
	}
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
}

// TestRecordUsageScope: a gateway token records only within its scope
// (outside it the subject has no policy), and an id another tenant's
// record holds is DIGEST_MISMATCH without that tenant's receipt.
func TestRecordUsageScope(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100"}]}}`, adminToken)
	body := func(id, subject string) string {
		return `{"reservationId":"` + id + `","operationId":"op","subject":"` + subject + `","route":"chat.generate","actualUnits":{"tokens":5}}`
	}
	h.wantError(h.call("RecordUsage", body("a-1", "tenant-a/x"), gwBToken), http.StatusNotFound, "not_found", server.ReasonNoPolicy)
	h.ok("RecordUsage", body("shared", "tenant-a/x"), gwAToken)
	r := h.call("RecordUsage", body("shared", "tenant-b/y"), gwBToken)
	h.wantError(r, http.StatusConflict, "already_exists", server.ReasonDigestMismatch)
	if strings.Contains(string(r.raw), "tenant-a") {
		t.Fatalf("the answer names the other tenant: %s", r.raw)
	}
	h.wantError(h.call("RecordUsage", body("v-1", "tenant-b/y"), viewerToken), http.StatusForbidden, "permission_denied", "")
}

// TestReserveRefusesARecordDigest: a Reserve whose request_digest starts
// with "record:" (a RecordUsage's digest) is 400 INVALID_COMMAND, so that
// no reservation can pass for a record once retention removed it.
func TestReserveRefusesARecordDigest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	forged := fmt.Sprintf(`{"reservationId":"forged","subject":"tenant-7","route":"chat.generate","units":{"tokens":5},"requestDigest":%q}`,
		server.RecordDigest("tenant-7", "chat.generate", ""))
	r := h.call("Reserve", forged, "")
	h.wantError(r, 400, "invalid_argument", server.ReasonInvalidCommand)
	if msg, _ := r.body["message"].(string); !strings.Contains(msg, `"record:"`) {
		t.Errorf("message does not name the prefix: %s", r.raw)
	}
	if got := h.ok("RecordUsage", recordBody("forged", "op-1", 5), ""); got["replayed"] == true {
		t.Fatalf("record after the refused reserve replayed: %v", got)
	}
}

// recordDigestExample is the RecordUsage digest docs/API.md shows: the
// canonical digest of tenant-7, chat.generate, region left empty, with no
// units and empty estimator digest and body hash, behind "record:".
const recordDigestExample = "record:sha256:37251d02c3d3d7b11ed328d387964b6b96a19b04edaa12c8b8fe6dccd08ac9f8"

// TestRecordUsageDigestAsDocumented: a RecordUsage's receipt carries
// exactly the digest docs/API.md spells out, so a client in another
// language can compute it (e.g. to tell its records from its reserves).
func TestRecordUsageDigestAsDocumented(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	got := h.ok("RecordUsage", recordBody("rec-doc", "op-1", 5), "")
	res, _ := got["reservation"].(map[string]any)
	if res["requestDigest"] != recordDigestExample {
		t.Fatalf("RecordUsage digest = %v, docs/API.md says %s", res["requestDigest"], recordDigestExample)
	}
	doc, err := os.ReadFile("../docs/API.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "`"+recordDigestExample+"`") {
		t.Errorf("docs/API.md does not show the RecordUsage digest %s", recordDigestExample)
	}
}
