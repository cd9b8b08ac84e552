package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// rigSecret is the secret every route of an engineRig shares.
var rigSecret = []byte("0123456789abcdef-route-secret")

// engineRig is an engine running the USAGE_UNKNOWN resolver with a
// config file loaded as serve loads it (loadResolverConfig), asking real
// HTTP status endpoints, with one any-subject policy per route.
type engineRig struct {
	t *testing.T
	e *engine.Engine
}

// newEngineRig writes the resolver config: settings are its top-level
// members other than routes (JSON, e.g. `"interval": "50ms"`, or empty),
// routes maps each route to its statusUrl (all with rigSecret). It starts
// an engine on st with eo and the loaded resolver options (adjusted by
// tweak, if any) and publishes each route's policy.
func newEngineRig(t *testing.T, st store.Store, settings string, routes map[string]string, eo engine.Options, tweak func(*engine.ResolverOptions)) *engineRig {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "route.secret"), rigSecret, 0o600); err != nil {
		t.Fatal(err)
	}
	members := []string{}
	if settings != "" {
		members = append(members, settings)
	}
	var entries []string
	for route, url := range routes {
		entries = append(entries, fmt.Sprintf(`%q: {"statusUrl": %q, "secretFile": "route.secret"}`, route, url))
	}
	members = append(members, `"routes": {`+strings.Join(entries, ",")+`}`)
	cfgPath := filepath.Join(dir, "resolver.json")
	if err := os.WriteFile(cfgPath, []byte("{"+strings.Join(members, ", ")+"}"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadResolverConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	opts := cfg.opts
	if tweak != nil {
		tweak(&opts)
	}
	eo.Resolver = &opts
	e := engine.New(st, eo)
	t.Cleanup(func() { e.Close() })
	rig := &engineRig{t: t, e: e}
	for route := range routes {
		p := ledger.Policy{
			Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: route, Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 30, RefillUnits: 10, RefillInterval: time.Second}},
			HoldTTL:    time.Hour,
		}.WithDefaults()
		rig.do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	return rig
}

func (rig *engineRig) do(c ledger.Command) {
	rig.t.Helper()
	if res, err := rig.e.Do(context.Background(), c); err != nil || res.Err != nil {
		rig.t.Fatalf("%v %s: %v %v", c.Kind, c.ReservationID, err, res.Err)
	}
}

// unknown reserves, starts (operation "op-"+id) and marks USAGE_UNKNOWN
// the ids on route.
func (rig *engineRig) unknown(route string, ids ...string) {
	rig.t.Helper()
	for _, id := range ids {
		rig.do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: "tenant-7", Route: route, Region: "eu", Units: ledger.Amounts{300}})
		rig.do(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
		rig.do(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id})
	}
}

// state is id's state now.
func (rig *engineRig) state(id string) ledger.State {
	rig.t.Helper()
	r, err := rig.e.Reservation(context.Background(), id)
	if err != nil {
		rig.t.Fatal(err)
	}
	return r.State
}

// statusQuestion checks the signature of a status question (answering
// 401 when it fails) and returns the reservation and operation asked about.
func statusQuestion(w http.ResponseWriter, r *http.Request) (reservation, operation string, ok bool) {
	operation = strings.TrimPrefix(r.URL.Path, "/operations/")
	reservation = r.URL.Query().Get("reservationId")
	if err := opstatus.VerifyRequest(rigSecret, r, reservation, operation, time.Now()); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return "", "", false
	}
	return reservation, operation, true
}

// answerStatus answers the question about operation of reservation with
// status (finished: 7 tokens), signed with secret.
func answerStatus(w http.ResponseWriter, r *http.Request, secret []byte, reservation, operation, status string) {
	a := opstatus.Answer{Status: status, OperationID: operation, ReservationID: reservation}
	if status == opstatus.StatusFinished {
		a.ActualUnits = map[string]int64{"tokens": 7}
	}
	opstatus.WriteAnswer(w, r, secret, a)
}

// answer checks a status question and answers it with status, signed
// with rigSecret.
func answer(w http.ResponseWriter, r *http.Request, status string) {
	if reservation, operation, ok := statusQuestion(w, r); ok {
		answerStatus(w, r, rigSecret, reservation, operation, status)
	}
}

// ids are n ids "prefix-000", "prefix-001", ...
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}
