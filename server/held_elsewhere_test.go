package server_test

import (
	"strings"
	"testing"
)

// GetAccount shows, per unit of the subject's current account, what its
// other generations still hold reserved (heldElsewhere, docs/API.md
// GetAccount): the reason available stops below burst minus the account's
// own holds. 600 tokens held under generation 1, generation 2 published:
// the switch moves the 400 available, generation 2 counts the 600 held
// under generation 1, and its available (300 after a reserve of 100)
// stays below 1000 - 100 until that hold ends.
func TestGetAccountShowsHeldElsewhere(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("old", 600), "")
	h.ok("PublishPolicy", strings.Replace(tokensPolicy, `"holdTtl":"30s"`, `"holdTtl":"40s"`, 1), "")
	h.ok("Reserve", reserveBody("new", 100), "") // switches to generation 2
	tokensOf := func() (old, current map[string]any) {
		t.Helper()
		acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
		accounts, _ := acct["accounts"].([]any)
		if len(accounts) != 2 {
			t.Fatalf("want the accounts of generations 1 and 2: %v", acct)
		}
		balance := func(i int) map[string]any {
			b := accounts[i].(map[string]any)["balances"].([]any)[0].(map[string]any)
			if b["unit"] != "tokens" {
				t.Fatalf("first balance is not tokens: %v", b)
			}
			return b
		}
		return balance(0), balance(1)
	}
	old, current := tokensOf()
	if num(current["heldElsewhere"]) != 600 || num(current["available"]) != 300 || num(current["reserved"]) != 100 {
		t.Fatalf("generation 2 tokens: %v; want heldElsewhere 600 (generation 1's hold), available 300, reserved 100", current)
	}
	if _, shown := old["heldElsewhere"]; shown || num(old["reserved"]) != 600 {
		t.Fatalf("generation 1 tokens: %v; want reserved 600 and no heldElsewhere (it is not current)", old)
	}
	h.ok("Release", `{"reservationId":"old"}`, "")
	if _, current = tokensOf(); current["heldElsewhere"] != nil {
		t.Fatalf("generation 2 tokens after generation 1's hold ended: %v; want no heldElsewhere", current)
	}
}
