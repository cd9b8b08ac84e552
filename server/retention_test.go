package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
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
	// /statusz shows the pass to an operator: one reservation retired, no
	// tombstone forgotten yet (each under its own field).
	var st server.Status
	if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
		t.Fatal(err)
	}
	if r := st.Retention; r == nil || r.Passes != 1 || r.Retired != 1 || r.Forgotten != 0 || r.LastPassAt == nil {
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

// forgettingStore removes one reservation for good (retired past the
// tombstone horizon, so no tombstone is left) right after the server has
// read it outside a transaction, before the ledger reads it: what
// retention on another replica may do between the two reads. It writes
// through the store's own transaction, as the engine's retention does.
type forgettingStore struct {
	store.Store
	mu     sync.Mutex
	id     string // armed: forget this id after its next read
	at     time.Time
	forgot bool
	// rollback, when set, is a generation rolled back in the same
	// transaction (another replica's operator, between the two reads).
	rollback ledger.PolicyKey
	gen      uint64
	// reuse, when set, are commands applied in a second transaction
	// after the retire's (another tenant reserving the forgotten id).
	reuse []ledger.Command
}

func (s *forgettingStore) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	r, err := s.Store.ReservationGet(ctx, id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || id != s.id {
		return r, err
	}
	s.id = ""
	forget := []ledger.Command{{Kind: ledger.KindRetire, ReservationID: id, Before: s.at, ForgetBefore: s.at}}
	if s.gen != 0 {
		forget = append(forget, ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: s.rollback, Generation: s.gen})
	}
	if terr := s.commit(ctx, forget); terr != nil {
		return r, terr
	}
	if len(s.reuse) > 0 {
		if terr := s.commit(ctx, s.reuse); terr != nil {
			return r, terr
		}
	}
	s.forgot = true
	return r, err
}

// commit applies cmds in one transaction of the store, as the engine
// does, and fails on any refusal.
func (s *forgettingStore) commit(ctx context.Context, cmds []ledger.Command) error {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	book := store.NewBook(ctx, tx, 1)
	for i := range cmds {
		if res := ledger.Apply(book, &cmds[i], s.at); res.Err != nil {
			return fmt.Errorf("%s %s: %w", cmds[i].Kind, cmds[i].ReservationID, res.Err)
		}
	}
	if err := tx.Write(ctx, book.Changes()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// A Reserve whose units the deciding generation cannot place, under the
// id of a finished reservation, goes to the ledger with that reservation's
// generation so that the ledger answers the retry (replay or
// DIGEST_MISMATCH). It carried the reservation's own amounts: if retention
// forgot the id between the server's read and the ledger's, the ledger
// admitted a new reservation with amounts the client never asked for,
// while the server answered UNKNOWN_UNIT. Nothing may be admitted then,
// and the answers of a retry that finds the id stay as they were.
func TestUnmappableRetryOfAForgottenIDAdmitsNothing(t *testing.T) {
	var forgetting *forgettingStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		forgetting = &forgettingStore{Store: st}
		return forgetting
	}})
	h.ok("PublishPolicy", tokensPolicy, "")
	first := h.ok("Reserve", reserveBody("gone", 100), "")
	h.ok("Release", `{"reservationId":"gone"}`, "")
	digest, _ := field(first, "reservation", "requestDigest").(string)
	if digest == "" {
		t.Fatalf("no request digest in %v", first)
	}
	// "images" is a unit generation 1 lacks: the server cannot map it.
	unmappable := func(digest string) string {
		return fmt.Sprintf(`{"reservationId":"gone","subject":"tenant-7","route":"chat.generate","units":{"tokens":100,"images":1},"requestDigest":%q}`, digest)
	}
	// The id found: the retry is the ledger's to answer, as before.
	if again := h.ok("Reserve", unmappable(digest), ""); again["replayed"] != true || field(again, "reservation", "state") != "RESERVATION_STATE_RELEASED" {
		t.Fatalf("retry with the same digest: %v", again)
	}
	h.wantError(h.call("Reserve", unmappable("sha256:"+strings.Repeat("ab", 32)), ""), 409, "already_exists", server.ReasonDigestMismatch)

	// The id forgotten between the two reads.
	forgetting.mu.Lock()
	forgetting.id, forgetting.at = "gone", h.clock.Now().Add(time.Hour)
	forgetting.mu.Unlock()
	r := h.call("Reserve", unmappable("sha256:"+strings.Repeat("cd", 32)), "")
	forgetting.mu.Lock()
	forgot := forgetting.forgot
	forgetting.mu.Unlock()
	if !forgot {
		t.Fatal("the store did not forget the id between the reads: the test proves nothing")
	}
	h.wantError(r, 400, "invalid_argument", server.ReasonUnknownUnit)
	if got := h.call("GetReservation", `{"reservationId":"gone"}`, ""); got.status != 404 {
		t.Errorf("a reservation was admitted under the forgotten id: %s", got.raw)
	}
	// protojson leaves a zero reserved out.
	if account := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, ""); strings.Contains(fmt.Sprint(account), "reserved") {
		t.Errorf("capacity is held after the refusal: %v", account)
	}
}

// A RecordUsage whose units the generation the server believes decides
// cannot place, under the id of a record of an earlier generation that
// can, goes to the ledger mapped by that earlier generation, so that the
// ledger answers the retry. Should retention forget the id between the
// server's read and the ledger's while that earlier generation decides
// again by then (another replica rolled the newer one back), the ledger
// records the usage: the answer must be that record, not the server's
// UNKNOWN_UNIT, which told the client nothing was recorded while its
// usage was charged.
func TestRecordUsageOfAForgottenIDAnswersWhatTheLedgerDid(t *testing.T) {
	var forgetting *forgettingStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		forgetting = &forgettingStore{Store: st}
		return forgetting
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"1000"},{"unit":"images","burst":"10"}]}}`, "")
	body := `{"reservationId":"rec","operationId":"op-1","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":10,"images":1}}`
	h.ok("RecordUsage", body, "")
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"1000"}]}}`, "")
	// The id found: the ledger replays the retry, as before.
	if again := h.ok("RecordUsage", body, ""); again["replayed"] != true {
		t.Fatalf("retry with the id kept: %v", again)
	}

	forgetting.mu.Lock()
	forgetting.id, forgetting.at = "rec", h.clock.Now().Add(time.Hour)
	forgetting.rollback = ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "global"}
	forgetting.gen = 2
	forgetting.mu.Unlock()
	r := h.call("RecordUsage", body, "")
	forgetting.mu.Lock()
	forgot := forgetting.forgot
	forgetting.mu.Unlock()
	if !forgot {
		t.Fatal("the store did not forget the id between the reads: the test proves nothing")
	}
	stored := h.call("GetReservation", `{"reservationId":"rec"}`, "")
	switch {
	case stored.status == 200 && r.status != 200:
		t.Fatalf("the usage was recorded (%s) but the answer was %d %s", stored.raw, r.status, r.raw)
	case stored.status != 200 && r.status == 200:
		t.Fatalf("answered %s but nothing is recorded: %s", r.raw, stored.raw)
	case stored.status != 200:
		t.Fatalf("nothing recorded: the rollback did not make generation 1 decide (%s); the test proves nothing", r.raw)
	}
	got := h.ok("RecordUsage", body, "")
	if got["replayed"] != true || num(got["policyGeneration"]) != 1 || field(got, "reservation", "retired") == true {
		t.Fatalf("the record made then: %v", got)
	}
}
