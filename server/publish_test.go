package server_test

import (
	"encoding/json"
	"testing"
)

// PublishPolicy ignores what the server sets (generation, publishedAt,
// active, rolledBack), as the proto and API.md say: a policy read with
// GetPolicy publishes as it is, and a value put there by hand neither
// names a generation to overwrite, nor backdates it, nor publishes it
// inactive or rolled back. Here the read policy, with those four fields
// changed, is a replay of the active generation, which keeps its own.
func TestPublishIgnoresServerSetFields(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	first := h.ok("PublishPolicy", tokensPolicy, "")
	read := h.ok("GetPolicy", `{"generation":"1"}`, "")
	policy := read["policy"].(map[string]any)
	policy["generation"] = "99"
	policy["publishedAt"] = "2020-01-01T00:00:00Z"
	policy["active"] = false
	policy["rolledBack"] = true
	body, err := json.Marshal(map[string]any{"policy": policy})
	if err != nil {
		t.Fatal(err)
	}
	again := h.ok("PublishPolicy", string(body), "")
	if again["replayed"] != true || field(again, "policy", "generation") != "1" || field(again, "policy", "active") != true ||
		field(again, "policy", "rolledBack") != nil || field(again, "policy", "publishedAt") != field(first, "policy", "publishedAt") {
		t.Fatalf("publish of a read policy with server-set fields changed: %v (first %v)", again, first)
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list["policies"].([]any)) != 1 {
		t.Fatalf("a second generation was published: %v", list)
	}
}
