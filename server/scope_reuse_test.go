package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// An id-only call of a scoped token checks the stored reservation's
// subject, then sends the command by id. Should retention forget the
// caller's finished reservation between the two, and another tenant
// reserve under the same id (ids are the clients'), the command must not
// act on that tenant's reservation, nor say anything about it: it is
// answered byte for byte as an id nobody used, and the other tenant's
// reservation stays as it was. The store here swaps the reservation right
// after the server's scope read, over real HTTP, on SQLite.
func TestScopedCallNeverActsOnAReusedID(t *testing.T) {
	var swapping *forgettingStore
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, wrapStore: func(st store.Store) store.Store {
		swapping = &forgettingStore{Store: st}
		return swapping
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, adminToken)
	tenantB := ledger.PolicyKey{Subject: "tenant-b/u1", Route: "chat.generate", Region: "global"}
	const op = "op-shared" // what tenant-b's work was started with
	cases := []struct {
		method, body string
		// started: tenant-b's reservation is STARTED (else RESERVED),
		// the state the caller's command would act on.
		started bool
		batch   bool
	}{
		{method: "Start", body: `{"reservationId":"%s","operationId":"` + op + `"}`},
		{method: "Release", body: `{"reservationId":"%s"}`},
		{method: "MarkUsageUnknown", body: `{"reservationId":"%s"}`, started: true},
		{method: "Settle", body: `{"reservationId":"%s","operationId":"` + op + `","actualUnits":{"tokens":1}}`, started: true},
		{method: "SettleBatch", body: `{"requests":[{"reservationId":"%s","operationId":"` + op + `","actualUnits":{"tokens":1}}]}`, started: true, batch: true},
	}
	for _, c := range cases {
		id := "reused-" + strings.ToLower(c.method)
		// tenant-a's own reservation, finished: its gateway retries a
		// late call on it, which the scope check lets through.
		h.ok("Reserve", `{"reservationId":"`+id+`","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":10}}`, gwAToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"`+op+`"}`, gwAToken)
		h.ok("Settle", `{"reservationId":"`+id+`","operationId":"`+op+`","actualUnits":{"tokens":5}}`, gwAToken)
		h.clock.Advance(time.Second)

		reuse := []ledger.Command{{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:tenant-b-" + id,
			Subject: tenantB.Subject, Route: tenantB.Route, Region: tenantB.Region, Units: ledger.Amounts{20}}}
		wantState := "RESERVATION_STATE_RESERVED"
		if c.started {
			reuse = append(reuse, ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: op})
			wantState = "RESERVATION_STATE_STARTED"
		}
		swapping.mu.Lock()
		swapping.id, swapping.at, swapping.reuse, swapping.forgot = id, h.clock.Now(), reuse, false
		swapping.mu.Unlock()
		got := h.call(c.method, strings.ReplaceAll(c.body, "%s", id), gwAToken)
		swapping.mu.Lock()
		swapped := swapping.forgot
		swapping.id = ""
		swapping.mu.Unlock()
		if !swapped {
			t.Fatalf("%s: the store did not swap the reservation after the scope read: the test proves nothing (%s)", c.method, got.raw)
		}

		unknown := h.call(c.method, strings.ReplaceAll(c.body, "%s", "never-used"), gwAToken)
		if c.batch {
			if got.status != http.StatusOK || !strings.Contains(string(unknown.raw), server.ReasonReservationNotFound) {
				t.Fatalf("%s: %d %s (an unknown id: %s)", c.method, got.status, got.raw, unknown.raw)
			}
		} else {
			h.wantError(unknown, http.StatusNotFound, "not_found", server.ReasonReservationNotFound)
		}
		if want := strings.ReplaceAll(string(unknown.raw), "never-used", id); string(got.raw) != want || got.status != unknown.status {
			t.Errorf("%s of an id another tenant took after the scope check answers\n  %d %s\nbut an unknown id\n  %d %s",
				c.method, got.status, got.raw, unknown.status, want)
		}
		theirs := h.ok("GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id), gwBToken)
		if state := field(theirs, "reservation", "state"); state != wantState {
			t.Errorf("%s by tenant-a left tenant-b's reservation %v, want %s: %v", c.method, state, wantState, theirs)
		}
	}

	// A scoped retry of a call on the caller's own reservation, checked
	// against its own account, replays as before.
	h.ok("Reserve", `{"reservationId":"own","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":10}}`, gwAToken)
	for _, c := range []struct{ method, body string }{
		{"Start", `{"reservationId":"own","operationId":"op-own"}`},
		{"MarkUsageUnknown", `{"reservationId":"own"}`},
		{"Settle", `{"reservationId":"own","operationId":"op-own","actualUnits":{"tokens":4}}`},
	} {
		first := h.ok(c.method, c.body, gwAToken)
		again := h.ok(c.method, c.body, gwAToken)
		if first["replayed"] == true || again["replayed"] != true || fmt.Sprint(again["reservation"]) != fmt.Sprint(first["reservation"]) {
			t.Errorf("%s retried by its owner: %v after %v", c.method, again, first)
		}
	}
}
