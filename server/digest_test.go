package server_test

import (
	"net/http"
	"testing"

	"github.com/capledger/capledger/api/digest"
)

// TestServerDerivesTheCanonicalDigest checks over a real server that a
// reserve without request_digest is stored under the canonical digest of
// docs/CLIENTS.md (no estimator, no body hash), so that a retry carrying
// the digest a client computed replays instead of being refused as another
// request, and that a reused id for other units is still refused.
func TestServerDerivesTheCanonicalDigest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")

	want, err := digest.Request(digest.Input{Subject: "tenant-7", Route: "chat.generate",
		Units: map[string]int64{"tokens": 600, "requests": 1}})
	if err != nil {
		t.Fatal(err)
	}
	first := h.ok("Reserve", reserveBody("rl-derived", 600), "")
	if got := field(first, "reservation", "requestDigest"); got != want {
		t.Fatalf("derived digest %v, canonical %s", got, want)
	}

	// The same request, now with the digest a client computed (and the
	// region spelt out): the same receipt.
	retry := h.ok("Reserve", `{"reservationId":"rl-derived","subject":"tenant-7","route":"chat.generate","region":"global",
		"units":{"tokens":600,"requests":1},"requestDigest":"`+want+`"}`, "")
	if retry["replayed"] != true || field(retry, "reservation", "requestDigest") != want {
		t.Fatalf("retry with the client's canonical digest was not a replay: %v", retry)
	}

	// A client-computed digest reserved first: the server's derivation
	// for the retry without a digest matches it.
	h.ok("Reserve", `{"reservationId":"rl-client","subject":"tenant-7","route":"chat.generate",
		"units":{"tokens":100,"requests":1},"requestDigest":"`+mustDigest(t, 100)+`"}`, "")
	if again := h.ok("Reserve", reserveBody("rl-client", 100), ""); again["replayed"] != true {
		t.Fatalf("retry without a digest of a client-digested reserve was not a replay: %v", again)
	}

	// The id reused for other units is another request.
	h.wantError(h.call("Reserve", reserveBody("rl-derived", 601), ""), http.StatusConflict, "already_exists", "DIGEST_MISMATCH")
	// Negative units: no digest can be derived; the request is refused
	// as invalid before any lookup, for a new id and an existing one alike
	// (API.md, "Order of checks").
	h.wantError(h.call("Reserve", reserveBody("rl-negative", -1), ""), http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
	h.wantError(h.call("Reserve", reserveBody("rl-derived", -1), ""), http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
}

func mustDigest(t *testing.T, tokens int64) string {
	t.Helper()
	d, err := digest.Request(digest.Input{Subject: "tenant-7", Route: "chat.generate", Region: "global",
		Units: map[string]int64{"tokens": tokens, "requests": 1}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
