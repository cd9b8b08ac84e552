package server_test

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
)

// The statuses API.md names outside the error codes (issue 13): 415 for a
// wrong or missing Content-Type, 405 for GET or PUT on a write method, 404
// for an unknown method, each with the body and headers the table says.
func TestStatusesTheDocsName(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	send := func(method, path, contentType, body string) response {
		req, _ := http.NewRequest(method, h.url+path, strings.NewReader(body))
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		return h.do(req)
	}
	for _, ct := range []string{"", "text/plain"} {
		r := send("POST", "/capledger.v1.LedgerService/Reserve", ct, `{}`)
		if r.status != http.StatusUnsupportedMediaType || !strings.Contains(r.header.Get("Accept-Post"), "application/json") || len(r.raw) != 0 {
			t.Errorf("Content-Type %q: %d %v %q", ct, r.status, r.header, r.raw)
		}
	}
	for _, method := range []string{"GET", "PUT"} {
		r := send(method, "/capledger.v1.LedgerService/Reserve", "application/json", `{}`)
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "POST" {
			t.Errorf("%s on a write method: %d %v %q", method, r.status, r.header, r.raw)
		}
	}
	for _, path := range []string{"/capledger.v1.LedgerService/Reserv", "/v1/reserve"} {
		r := send("POST", path, "application/json", `{}`)
		if r.status != http.StatusNotFound || r.body["code"] != "unimplemented" || !strings.Contains(r.body["message"].(string), path) {
			t.Errorf("unknown method %s: %d %q", path, r.status, r.raw)
		}
	}
}

// /healthz, /readyz, /statusz and /metrics are endpoints (API.md, "Other
// endpoints": GET). A POST or DELETE on them answered 404 "no method or
// endpoint at /healthz", which is false and reads as a wrong path to whoever
// configured a health check with another method; they answer 405 with
// Allow: GET, HEAD, as the console at /ui does, and GET still works.
func TestEndpointsAnswerOtherMethodsWith405(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, path := range []string{"/healthz", "/readyz", "/statusz", "/metrics"} {
		for _, method := range []string{"POST", "DELETE", "PUT"} {
			req, _ := http.NewRequest(method, h.url+path, strings.NewReader("x"))
			r := h.do(req)
			if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: %d Allow %q %q, want 405 Allow \"GET, HEAD\"", method, path, r.status, r.header.Get("Allow"), r.raw)
			}
			// The text says what Allow says, for whoever reads the body alone.
			if want := "method not allowed: " + method + " " + path + " answers GET and HEAD\n"; string(r.raw) != want {
				t.Errorf("%s %s: body %q, want %q", method, path, r.raw, want)
			}
		}
		req, _ := http.NewRequest("GET", h.url+path, nil)
		if r := h.do(req); r.status != http.StatusOK {
			t.Errorf("GET %s: %d %q", path, r.status, r.raw)
		}
	}
}

// Per-command cap and explicit durations (issue 13).
func TestLimitsAnswerTheirDocumentedCodes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	// A reserve of 2^63-1 can never fit: RESERVATION_TOO_LARGE, no Retry-After.
	r := h.call("Reserve", `{"reservationId":"huge","subject":"tenant-7","route":"chat.generate","units":{"tokens":"9223372036854775807","requests":1}}`, "")
	h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonReservationTooLarge)
	if r.header.Get("Retry-After") != "" {
		t.Errorf("Retry-After on a reservation that can never fit: %v", r.header)
	}
	// A settle past 2^53 in one dimension: INVALID_COMMAND, nothing recorded.
	h.ok("Reserve", reserveBody("s", 10), "")
	h.ok("Start", `{"reservationId":"s","operationId":"op"}`, "")
	h.wantError(h.call("Settle", `{"reservationId":"s","operationId":"op","actualUnits":{"tokens":"9007199254740993","requests":1}}`, ""),
		http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)

	policy := func(holdTTL string) string {
		return `{"policy":{"subject":"t","route":"r","holdTtl":"` + holdTTL + `","dimensions":[{"unit":"tokens","burst":"10"}]}}`
	}
	for _, ttl := range []string{"0s", "0.001s", "0.099s"} {
		r := h.call("PublishPolicy", policy(ttl), "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if !strings.Contains(r.body["message"].(string), "minimum 0.100s") {
			t.Errorf("holdTtl %s: %s", ttl, r.raw)
		}
	}
	pub := h.ok("PublishPolicy", policy("0.1s"), "")
	if field(pub, "policy", "holdTtl") != "0.100s" {
		t.Errorf("holdTtl 0.1s published as %v", field(pub, "policy", "holdTtl"))
	}
	h.wantError(h.call("PublishPolicy", `{"policy":{"subject":"t","route":"r","epochLength":"0s","dimensions":[{"unit":"tokens","burst":"10"}]}}`, ""),
		http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
	// An epoch shorter than a second (the epoch worker's look, every
	// second) was published: "0.001s" closed an epoch, a statement kept
	// forever, on nearly every command.
	epoch := func(length string) string {
		return `{"policy":{"subject":"t3","route":"r","epochLength":"` + length + `","dimensions":[{"unit":"tokens","burst":"10"}]}}`
	}
	for _, length := range []string{"0.001s", "0.999999999s"} {
		r := h.call("PublishPolicy", epoch(length), "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if !strings.Contains(r.body["message"].(string), "minimum 1s") {
			t.Errorf("epochLength %s: %s", length, r.raw)
		}
	}
	if pub := h.ok("PublishPolicy", epoch("1s"), ""); field(pub, "policy", "epochLength") != "1s" {
		t.Errorf("epochLength 1s published as %v", field(pub, "policy", "epochLength"))
	}
	// Left out, the default applies.
	if pub := h.ok("PublishPolicy", `{"policy":{"subject":"t2","route":"r","dimensions":[{"unit":"tokens","burst":"10"}]}}`, ""); field(pub, "policy", "holdTtl") != "60s" {
		t.Errorf("default holdTtl: %v", pub)
	}
}

// A gzip-compressed Connect body that inflates past the limit gets the
// same 413 as a large one on the wire, never connect's 429 (a capacity
// rejection to a client), and nothing of it is applied; one within the
// limit is served, and a broken gzip stream is a 400.
func TestCompressedBodyOverTheLimitIs413(t *testing.T) {
	h := newHarness(t, harnessOptions{maxBody: 4096})
	h.ok("PublishPolicy", tokensPolicy, "")
	send := func(body []byte) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/Reserve", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		return h.do(req)
	}
	gz := func(s string) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write([]byte(s))
		zw.Close()
		return buf.Bytes()
	}
	bomb := `{"reservationId":"bomb","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"requestDigest":"` +
		strings.Repeat("x", 100_000) + `"}`
	r := send(gz(bomb))
	if r.status != http.StatusRequestEntityTooLarge || r.body["code"] != "resource_exhausted" ||
		!strings.Contains(r.body["message"].(string), "once decompressed") {
		t.Errorf("gzip body inflating past the limit: %d %s", r.status, r.raw)
	}
	h.wantError(h.call("GetReservation", `{"reservationId":"bomb"}`, ""), http.StatusNotFound, "not_found", server.ReasonReservationNotFound)
	if r := send(gz(reserveBody("small", 1))); r.status != http.StatusOK {
		t.Errorf("gzip body within the limit: %d %s", r.status, r.raw)
	}
	if r := send([]byte("not gzip at all")); r.status != http.StatusBadRequest || r.body["code"] != "invalid_argument" {
		t.Errorf("broken gzip body: %d %s", r.status, r.raw)
	}
}

// A name holding a NUL byte (JSON "\u0000") is refused as invalid: the
// PostgreSQL store cannot keep one and would answer unavailable, which a
// client retries forever.
func TestNULInANameIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100"}]}}`, "")
	h.ok("Reserve", `{"reservationId":"taken","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, "")
	h.ok("Start", `{"reservationId":"taken","operationId":"op"}`, "")
	for _, c := range []struct{ method, body, reason string }{
		{"Reserve", `{"reservationId":"a\u0000b","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, server.ReasonInvalidCommand},
		{"Reserve", `{"reservationId":"nul-subject","subject":"tenant\u0000","route":"chat.generate","units":{"tokens":1}}`, server.ReasonInvalidCommand},
		{"Start", `{"reservationId":"x","operationId":"op\u0000"}`, server.ReasonInvalidCommand},
		{"GetAccount", `{"subject":"tenant\u0000","route":"chat.generate"}`, server.ReasonInvalidCommand},
		{"PublishPolicy", `{"policy":{"subject":"t","route":"r\u0000","dimensions":[{"unit":"tokens","burst":"10"}]}}`, server.ReasonInvalidPolicy},
		{"PublishPolicy", `{"policy":{"subject":"t","route":"r","dimensions":[{"unit":"tok\u0000ens","burst":"10"}]}}`, server.ReasonInvalidPolicy},
		// A unit name in a command, as API.md's Limits says (it was
		// UNKNOWN_UNIT, and a retry of a taken id DIGEST_MISMATCH).
		{"Reserve", `{"reservationId":"nul-unit","subject":"tenant-7","route":"chat.generate","units":{"tok\u0000":1}}`, server.ReasonInvalidCommand},
		{"Reserve", `{"reservationId":"taken","subject":"tenant-7","route":"chat.generate","units":{"tokens":1,"x\u0000":1}}`, server.ReasonInvalidCommand},
		{"Settle", `{"reservationId":"taken","operationId":"op","actualUnits":{"tokens":1,"x\u0000":0}}`, server.ReasonInvalidCommand},
		// A NUL byte that starts the name is one too.
		{"Reserve", `{"reservationId":"nul-first","subject":"tenant-7","route":"chat.generate","units":{"\u0000tokens":1}}`, server.ReasonInvalidCommand},
		{"Settle", `{"reservationId":"taken","operationId":"op","actualUnits":{"tokens":1,"\u0000x":0}}`, server.ReasonInvalidCommand},
	} {
		r := h.call(c.method, c.body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", c.reason)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "NUL byte") {
			t.Errorf("%s %s: %s", c.method, c.body, r.raw)
		}
	}
	// Reads naming a subject, route or rollout: no row can hold a NUL byte,
	// and PostgreSQL refuses one in a query (they answered 503, which a
	// client retries forever).
	for _, c := range []struct{ path, body, reason string }{
		{"LedgerService/ListUsageUnknown", `{"subject":"tenant\u0000"}`, server.ReasonInvalidCommand},
		{"LedgerService/ListUsageUnknown", `{"route":"chat\u0000"}`, server.ReasonInvalidCommand},
		{"ConsoleService/ListSubjectReservations", `{"subject":"tenant\u0000"}`, server.ReasonInvalidCommand},
		{"ConsoleService/ListStatements", `{"subject":"tenant-7","route":"chat\u0000","policyGeneration":"1"}`, server.ReasonInvalidCommand},
		{"RolloutService/GetRollout", `{"name":"r\u0000"}`, server.ReasonInvalidRollout},
		{"RolloutService/SetRolloutShare", `{"name":"r\u0000","percent":1}`, server.ReasonInvalidRollout},
		{"RolloutService/UndoRolloutStep", `{"name":"r\u0000"}`, server.ReasonInvalidRollout},
		{"RolloutService/CreateRollout", `{"name":"r\u0000","hashBy":"route","routes":[{"route":"chat.generate"}]}`, server.ReasonInvalidRollout},
		{"RolloutService/CreateRollout", `{"name":"r","hashBy":"route","routes":[{"route":"chat\u0000"}]}`, server.ReasonInvalidRollout},
		// A shard receipt's id, read or reconciled: refused by the same
		// check (ReconcileShard read the shard with it: 404 here, 503 on
		// PostgreSQL when the shard exists).
		{"ShardService/GetShard", `{"shardId":"s","receiptIds":["a\u0000"]}`, server.ReasonInvalidCommand},
		{"ShardService/ReconcileShard", `{"shardId":"s","gatewayId":"gw","receipts":[{"reservationId":"a\u0000","state":"RESERVATION_STATE_RELEASED"}]}`, server.ReasonInvalidCommand},
	} {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+c.path, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		r := h.do(req)
		if r.status != http.StatusBadRequest || field(r.body, "details") == nil || !strings.Contains(string(r.raw), c.reason) || !strings.Contains(string(r.raw), "NUL byte") {
			t.Errorf("%s %s: %d %s; want 400 %s naming the NUL byte", c.path, c.body, r.status, r.raw, c.reason)
		}
	}
	if got := h.ok("GetReservation", `{"reservationId":"taken"}`, ""); field(got, "reservation", "state") != "RESERVATION_STATE_STARTED" {
		t.Errorf("a refused settle changed the reservation: %v", got)
	}
	if got := h.ok("GetAccount", `{"subject":"tenant","route":"chat.generate"}`, ""); len(got) != 0 {
		t.Errorf("a refused reserve opened an account: %v", got)
	}
}

// The same for a Connect GET whose message parameter is gzip-compressed
// (compression=gzip, base64=1): 413 past the limit once decompressed, the
// call served within it.
// A subject, route or region longer than ledger.MaxKeyBytes is refused as
// invalid (API.md, "Limits"): the PostgreSQL store keys its rows by the
// three, and a longer key failed the batch as unavailable, which a client
// retries forever (cmd/capledger's TestLongKeysOnPostgres runs it there).
func TestKeyLengthBounded(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	long := strings.Repeat("r", ledger.MaxKeyBytes+1)
	max := strings.Repeat("m", ledger.MaxKeyBytes)
	r := h.call("PublishPolicy", `{"policy":{"subject":"*","route":"`+long+`","dimensions":[{"unit":"tokens","burst":"10"}]}}`, "")
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+max+`","region":"`+max+`","dimensions":[{"unit":"tokens","burst":"10"}]}}`, "")
	h.ok("Reserve", `{"reservationId":"max","subject":"`+max+`","route":"`+max+`","region":"`+max+`","units":{"tokens":1}}`, "")
	req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.RolloutService/CreateRollout",
		strings.NewReader(`{"name":"long","hashBy":"route","routes":[{"route":"`+long+`"}]}`))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != http.StatusBadRequest || !strings.Contains(string(r.raw), server.ReasonInvalidRollout) {
		t.Errorf("a rollout of a route no policy can have: %d %s", r.status, r.raw)
	}
	for _, body := range []string{
		`{"reservationId":"long","subject":"` + long + `","route":"` + max + `","region":"` + max + `","units":{"tokens":1}}`,
		`{"reservationId":"max","subject":"` + long + `","route":"` + max + `","region":"` + max + `","units":{"tokens":1}}`, // a retry of a taken id too
	} {
		r := h.call("Reserve", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "subject is "+strconv.Itoa(len(long))+" bytes long") {
			t.Errorf("reserve with a long subject: %s", r.raw)
		}
	}
}

func TestCompressedGetMessageOverTheLimitIs413(t *testing.T) {
	h := newHarness(t, harnessOptions{maxBody: 4096})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("get-me", 1), "")
	get := func(message string) response {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write([]byte(message))
		zw.Close()
		q := url.Values{"encoding": {"json"}, "base64": {"1"}, "compression": {"gzip"},
			"message": {base64.RawURLEncoding.EncodeToString(buf.Bytes())}}
		req, _ := http.NewRequest(http.MethodGet, h.url+"/capledger.v1.LedgerService/GetReservation?"+q.Encode(), nil)
		return h.do(req)
	}
	r := get(`{"reservationId":"` + strings.Repeat("x", 100_000) + `"}`)
	if r.status != http.StatusRequestEntityTooLarge || r.body["code"] != "resource_exhausted" {
		t.Errorf("compressed GET message past the limit: %d %s", r.status, r.raw)
	}
	if r := get(`{"reservationId":"get-me"}`); r.status != http.StatusOK || field(r.body, "reservation", "reservationId") != "get-me" {
		t.Errorf("compressed GET message within the limit: %d %s", r.status, r.raw)
	}
}

// A shard receipt's id is checked as a reservation id (API.md, "Limits")
// wherever it arrives, GetShard's receiptIds or ReconcileShard's
// receipts: over 256 bytes it is INVALID_COMMAND before the shard is
// read; at 256 the call reaches the shard (here: none, 404).
func TestShardReceiptIDBounded(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, c := range []struct {
		id     string
		status int
	}{{strings.Repeat("r", 257), http.StatusBadRequest}, {strings.Repeat("r", 256), http.StatusNotFound}} {
		for _, call := range []struct{ path, body string }{
			{"GetShard", `{"shardId":"s","receiptIds":["` + c.id + `"]}`},
			{"ReconcileShard", `{"shardId":"s","gatewayId":"gw","receipts":[{"reservationId":"` + c.id + `","state":"RESERVATION_STATE_RELEASED"}]}`},
		} {
			req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+call.path, strings.NewReader(call.body))
			req.Header.Set("Content-Type", "application/json")
			if r := h.do(req); r.status != c.status {
				t.Errorf("%s with a %d-byte receipt id: %d %s, want %d", call.path, len(c.id), r.status, r.raw, c.status)
			}
		}
	}
}

// A misspelt method of another service than LedgerService was answered
// "methods are POST /capledger.v1.LedgerService/<Method>", pointing a
// client of /capledger.v1.AuditService/Audit (there is only StreamAudit)
// at the wrong service. The hint names the path's own service and its
// methods; a path of no service lists the services.
func TestUnknownMethodNamesItsServicesMethods(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	send := func(path string) string {
		req, _ := http.NewRequest("POST", h.url+path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		r := h.do(req)
		if r.status != http.StatusNotFound || r.body["code"] != "unimplemented" {
			t.Fatalf("%s: %d %q", path, r.status, r.raw)
		}
		return r.body["message"].(string)
	}
	if msg := send("/capledger.v1.AuditService/Audit"); !strings.Contains(msg, "AuditService's methods: StreamAudit") || strings.Contains(msg, "LedgerService") {
		t.Errorf("an unknown AuditService method: %q", msg)
	}
	if msg := send("/capledger.v1.LedgerService/Reserv"); !strings.Contains(msg, "LedgerService's methods: ") || !strings.Contains(msg, "Reserve, ReserveBatch") {
		t.Errorf("an unknown LedgerService method: %q", msg)
	}
	if msg := send("/v1/reserve"); !strings.Contains(msg, "POST /capledger.v1.<Service>/<Method>") || !strings.Contains(msg, "ShardService") {
		t.Errorf("a path of no service: %q", msg)
	}
}

// The body limit is inclusive (API.md, "Limits": a body larger than the
// limit is refused): a Connect body of exactly --max-body bytes is
// served, whether sized (Content-Length), chunked or gzip-compressed, and
// one byte more is 413.
func TestBodyOfExactlyTheLimitIsServed(t *testing.T) {
	const limit = 4096
	h := newHarness(t, harnessOptions{maxBody: limit})
	h.ok("PublishPolicy", tokensPolicy, "")
	// A reserve padded with trailing spaces to n bytes.
	body := func(id string, n int) []byte {
		b := reserveBody(id, 1)
		return []byte(b + strings.Repeat(" ", n-len(b)))
	}
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	for _, c := range []struct {
		name    string
		chunked bool
		gzip    bool
	}{{"sized", false, false}, {"chunked", true, false}, {"gzip", false, true}} {
		for _, n := range []int{limit, limit + 1} {
			raw := body(fmt.Sprintf("%s-%d", c.name, n), n)
			if c.gzip {
				raw = gz(raw)
			}
			var rd io.Reader = bytes.NewReader(raw)
			if c.chunked {
				rd = io.MultiReader(rd) // no length known: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/Reserve", rd)
			req.Header.Set("Content-Type", "application/json")
			if c.gzip {
				req.Header.Set("Content-Encoding", "gzip")
			}
			if c.chunked && req.ContentLength != 0 {
				t.Fatalf("chunked request has Content-Length %d", req.ContentLength)
			}
			r := h.do(req)
			want := http.StatusOK
			if n > limit {
				want = http.StatusRequestEntityTooLarge
			}
			if r.status != want {
				t.Errorf("%s body of %d bytes (limit %d): %d %s, want %d", c.name, n, limit, r.status, r.raw, want)
			}
		}
	}
}

// A request with several bad unit names is answered for the first of
// them in byte order, whatever order the map is read in: the same request
// always gets the same answer (an empty name sorts before "a\u0000").
func TestSeveralBadUnitNamesAnswerAlike(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	for i := range 20 {
		r := h.call("Reserve", `{"reservationId":"bad-units","subject":"tenant-7","route":"chat.generate","units":{"a\u0000":1,"":1,"b\u0000":1}}`, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "a unit name is empty") {
			t.Fatalf("call %d: %s, want the empty name's answer", i, r.raw)
		}
	}
}
