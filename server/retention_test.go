package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/server"
)

// After retention removed a finished reservation, the API answers from its
// tombstone over real HTTP: a retried reserve is replayed (retired set, no
// units, nothing held again), a retried settle is ALREADY_SETTLED, and
// GetReservation shows the tombstone's receipt.
func TestReplayAfterRetentionOverJSON(t *testing.T) {
	h := newHarness(t, harnessOptions{retention: time.Hour})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("kept-short", 600), "")
	h.ok("Start", `{"reservationId":"kept-short","operationId":"op-1"}`, "")
	h.ok("Settle", `{"reservationId":"kept-short","operationId":"op-1","actualUnits":{"tokens":200,"requests":1}}`, "")
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := h.engine.RetentionStats(); s.Retired != 1 {
		t.Fatalf("retention stats %+v", s)
	}
	// /statusz shows the pass to an operator.
	var st server.Status
	if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
		t.Fatal(err)
	}
	if r := st.Retention; r == nil || r.Passes != 1 || r.Retired != 1 || r.LastPassAt == nil {
		t.Fatalf("/statusz retention: %+v", st.Retention)
	}
	acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	again := h.ok("Reserve", reserveBody("kept-short", 600), "")
	if again["replayed"] != true || field(again, "reservation", "retired") != true ||
		field(again, "reservation", "state") != "RESERVATION_STATE_SETTLED" || field(again, "reservation", "reservedUnits") != nil {
		t.Fatalf("reserve replay from the tombstone: %v", again)
	}
	if after := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, ""); fmt.Sprint(after["accounts"]) != fmt.Sprint(acct["accounts"]) {
		t.Fatalf("a replay from the tombstone changed the account: %v -> %v", acct, after)
	}
	h.wantError(h.call("Settle", `{"reservationId":"kept-short","operationId":"op-1","actualUnits":{"tokens":200,"requests":1}}`, ""),
		400, "failed_precondition", server.ReasonAlreadySettled)
	got := h.ok("GetReservation", `{"reservationId":"kept-short"}`, "")
	if field(got, "reservation", "retired") != true || field(got, "reservation", "finishedAt") == nil {
		t.Fatalf("get after retention: %v", got)
	}
}

// A retry of a retired reservation the server cannot map under the
// deciding generation (a unit that generation lacks, or no policy at all)
// is still answered from its tombstone (API.md, "Order of checks"): a
// replay for the same request, DIGEST_MISMATCH for another, never
// INVALID_COMMAND for the units the server could not place.
func TestRetryOfATombstoneAfterPolicyChange(t *testing.T) {
	h := newHarness(t, harnessOptions{retention: time.Hour})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("kept", 100), "")
	h.ok("Release", `{"reservationId":"kept"}`, "")
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := h.engine.RetentionStats(); s.Retired != 1 {
		t.Fatalf("retention stats %+v", s)
	}
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"cost","burst":"50"}]}}`, "")
	if again := h.ok("Reserve", reserveBody("kept", 100), ""); again["replayed"] != true || field(again, "reservation", "retired") != true {
		t.Fatalf("retry under a generation without the unit: %v", again)
	}
	h.wantError(h.call("Reserve", reserveBody("kept", 101), ""), 409, "already_exists", server.ReasonDigestMismatch)
	// Units no generation has: not the request that reserved kept.
	h.wantError(h.call("Reserve", `{"reservationId":"kept","subject":"tenant-7","route":"chat.generate","units":{"bogus":1}}`, ""),
		409, "already_exists", server.ReasonDigestMismatch)
}

// TestRecordUsageReplayAfterRetention: after retention removed a record,
// a retry of it over real HTTP answers as its first answer did, as far as
// the tombstone allows: 200, replayed, the tombstone's receipt (retired,
// its terminal state, no units) and the generation charged; nothing is
// charged again. Another subject under the id is still DIGEST_MISMATCH.
func TestRecordUsageReplayAfterRetention(t *testing.T) {
	h := newHarness(t, harnessOptions{retention: time.Hour})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("RecordUsage", recordBody("rec-kept", "op-1", 1500), "")
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := h.engine.RetentionStats(); s.Retired != 1 {
		t.Fatalf("retention stats %+v", s)
	}
	acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	again := h.ok("RecordUsage", recordBody("rec-kept", "op-1", 1500), "")
	if again["replayed"] != true || field(again, "reservation", "retired") != true || num(again["policyGeneration"]) != 1 ||
		field(again, "reservation", "state") != "RESERVATION_STATE_SETTLED_WITH_DEBT" || field(again, "reservation", "actualUnits") != nil {
		t.Fatalf("record replay from the tombstone: %v", again)
	}
	if after := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, ""); fmt.Sprint(after["accounts"]) != fmt.Sprint(acct["accounts"]) {
		t.Fatalf("a replay from the tombstone changed the account: %v -> %v", acct, after)
	}
	h.wantError(h.call("RecordUsage", `{"reservationId":"rec-kept","operationId":"op-1","subject":"tenant-7","route":"chat.generate","region":"eu","actualUnits":{"tokens":1500}}`, ""),
		409, "already_exists", server.ReasonDigestMismatch)
}
