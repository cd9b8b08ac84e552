package server_test

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
)

// Totals over many accounts are capped at the int64 bound, never wrapped:
// 1,025 subjects under one "*" policy each record 2^53 tokens of usage on
// a burst of 1, so each spent 2^53 and owes 2^53 − 1, and the sums pass
// 2^63 − 1. GetFairness's totalSpent and DrainProgress's debt read
// 9223372036854775807 (they read negative: the int64 sums wrapped), the
// shares still add up to one, and the debt metric after an audit is
// positive.
func TestTotalsOverAccountsAreCappedNotWrapped(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"wide","dimensions":[{"unit":"tokens","burst":"1"}]}}`, "")
	const subjects = 1025
	for i := range subjects {
		h.ok("RecordUsage", fmt.Sprintf(`{"reservationId":"w-%d","operationId":"op","subject":"t-%d","route":"wide","actualUnits":{"tokens":"9007199254740992"}}`, i, i), "")
	}
	const capped = "9223372036854775807"

	fair := h.consoleOK("GetFairness", `{"route":"wide","limit":1000}`, "")
	group := fair["groups"].([]any)[0].(map[string]any)
	if group["totalSpent"] != capped {
		t.Errorf("GetFairness totalSpent %v, want %s", group["totalSpent"], capped)
	}
	for _, s := range group["subjects"].([]any) {
		share := s.(map[string]any)["servedShare"].(float64)
		if math.Abs(share-1.0/subjects) > 1e-9 {
			t.Fatalf("servedShare %v, want 1/%d", share, subjects)
		}
	}

	drain := h.rolloutOK("DrainProgress", `{"generations":["1"]}`, "")
	if debt := field(drain["generations"].([]any)[0].(map[string]any), "debt", "tokens"); debt != capped {
		t.Errorf("DrainProgress debt %v, want %s", debt, capped)
	}

	h.ok("Audit", `{}`, "")
	line := grep(h.get("/metrics"), `capledger_debt_outstanding_units{unit="tokens"}`)
	fields := strings.Fields(line)
	if len(fields) != 2 {
		t.Fatalf("no debt metric: %q", line)
	}
	if v, err := strconv.ParseFloat(fields[1], 64); err != nil || v < 9e18 {
		t.Errorf("debt metric %q, want about 9.22e18", line)
	}
}
