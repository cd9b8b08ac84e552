package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// A signed "finished" answer without actualUnits settles as zero usage
// (docs/CLIENTS.md: a unit left out is 0), as does one with
// "actualUnits": {}, and the resolver logs it at
// warn level with the reservation id: finished work that reports no usage
// more likely comes from a broken executor than from free work. One with
// its units settles them and logs no such warning. Real HTTP endpoint,
// resolver config loaded as serve loads it.
func TestResolverWarnsOfAFinishedAnswerWithoutUnits(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, op, ok := statusQuestion(w, r)
		if !ok {
			return
		}
		a := opstatus.Answer{Status: opstatus.StatusFinished, OperationID: op, ReservationID: res}
		switch res {
		case "with-units":
			a.ActualUnits = map[string]int64{"tokens": 7}
		case "empty-units":
			// "actualUnits": {} (WriteAnswer would leave an empty map out).
			body := fmt.Sprintf(`{"status":"finished","operationId":%q,"reservationId":%q,"actualUnits":{}}`, op, res)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(opstatus.HeaderSignature, opstatus.SignAnswer(rigSecret, r.Header.Get(opstatus.HeaderTimestamp), res, op, []byte(body)))
			_, _ = w.Write([]byte(body))
			return
		}
		opstatus.WriteAnswer(w, r, rigSecret, a)
	}))
	defer srv.Close()
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rig := newEngineRig(t, memstore.New(), "", map[string]string{"chat.generate": srv.URL},
		engine.Options{DisableWorkers: true, Logger: log}, nil)
	rig.unknown("chat.generate", "no-units", "empty-units", "with-units")

	rig.e.RunResolver(context.Background())
	for id, want := range map[string]ledger.Units{"no-units": 0, "empty-units": 0, "with-units": 7} {
		r, err := rig.e.Reservation(context.Background(), id)
		if err != nil || r.State != ledger.StateSettled || r.Actual[0] != want {
			t.Fatalf("%s: %s actual %v (%v), want SETTLED at %d", id, r.State, r.Actual[0], err, want)
		}
	}
	var warned []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "without actualUnits") {
			warned = append(warned, line)
		}
	}
	named := func(id string) bool {
		return slices.ContainsFunc(warned, func(line string) bool { return strings.Contains(line, "reservation="+id+" ") })
	}
	if len(warned) != 2 || !named("empty-units") || !named("no-units") {
		t.Fatalf("warnings of a finished answer without actualUnits: %q; want two, naming reservations empty-units and no-units\nlog:\n%s", warned, logs.String())
	}
}
