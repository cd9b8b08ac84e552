package server_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"database/sql"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// The bound of every string field a client names things with, by field
// name, as API.md's "Limits" states them; 0: no bound, only NUL and UTF-8.
// A string field of a request in neither this nor textFree fails the test:
// a new field must be given its rule (server/fields.go) and its line here.
var textBounds = map[protoreflect.Name]int{
	"subject": ledger.MaxKeyBytes, "route": ledger.MaxKeyBytes, "region": ledger.MaxKeyBytes, "subject_contains": ledger.MaxKeyBytes,
	"reservation_id": ledger.MaxIDBytes, "reservation_ids": ledger.MaxIDBytes, "receipt_ids": ledger.MaxIDBytes,
	"operation_id": ledger.MaxIDBytes, "shard_id": ledger.MaxIDBytes, "gateway_id": ledger.MaxIDBytes,
	"budget_id": ledger.MaxIDBytes, "identity": ledger.MaxIDBytes - len(ledger.LegacyGatewayPrefix),
	"name":           ledger.MaxRolloutNameBytes,
	"request_digest": 0, "estimator_digest": 0, "unit": 0,
}

// unitMaps are the maps of requests keyed by unit name, their keys bound
// as a policy's unit is (a longer name can match no dimension). A map of a
// request named in neither fails the test, as a string field does.
var unitMaps = map[protoreflect.Name]bool{"units": true, "actual_units": true, "reserved_units": true}

// textFree are string fields checked against a fixed set of values or
// opened as the server's own sealed token.
var textFree = map[protoreflect.Name]bool{"page_token": true, "hash_by": true, "mode": true, "legacy_decision": true, "schema": true}

// textReasons: the reason a bad field answers with, by the message that
// holds it (INVALID_COMMAND otherwise).
var textReasons = map[protoreflect.FullName]string{
	"capledger.v1.Policy": server.ReasonInvalidPolicy, "capledger.v1.Dimension": server.ReasonInvalidPolicy,
	"capledger.v1.CreateRolloutRequest": server.ReasonInvalidRollout, "capledger.v1.RolloutRoute": server.ReasonInvalidRollout,
	"capledger.v1.GetRolloutRequest": server.ReasonInvalidRollout, "capledger.v1.SetRolloutShareRequest": server.ReasonInvalidRollout,
	"capledger.v1.UndoRolloutStepRequest": server.ReasonInvalidRollout, "capledger.v1.EndRolloutRequest": server.ReasonInvalidRollout,
}

// textCase is one bad value of one field of one method's request.
type textCase struct {
	method protoreflect.MethodDescriptor
	// path names the field by its proto names (receipts[0].reservation_id);
	// the refusal names it as the JSON does (jsonPath).
	path   string
	field  protoreflect.FieldDescriptor
	holder protoreflect.FullName
	// batch: the field is in a batch item, refused as that item's error.
	batch bool
	// unitName: the field is a units map, the bad text one of its keys.
	unitName bool
}

// bound is the most bytes c's text may hold at the door (0: no bound). A
// unit name's length is checked where the units are mapped, by the
// deciding generation (TestOverlongUnitNameIsInvalidCommand).
func (c textCase) bound() int {
	if c.unitName {
		return 0
	}
	return textBounds[c.field.Name()]
}

// refusal is what the message of c's refusal says of a bad text whose
// problem is problem (badText.want).
func (c textCase) refusal(problem string) string {
	if c.unitName {
		return jsonPath(c.path) + ": a unit name " + problem
	}
	return jsonPath(c.path) + " " + problem
}

// jsonPath spells a path of proto field names (receipts[0].reservation_id)
// as the JSON does, and so as a refusal names it (receipts[0].reservationId):
// each underscore dropped and the letter after it upper-cased.
func jsonPath(path string) string {
	var b strings.Builder
	upper := false
	for _, r := range path {
		switch {
		case r == '_':
			upper = true
		case upper:
			b.WriteRune(unicode.ToUpper(r))
			upper = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// textCases walks every method of every service and returns, for each
// ruled string field of its request (nested messages included, with one
// item in each list), a case; unclassified names the string fields with
// no rule.
func textCases(t *testing.T) (cases []textCase, unclassified []string) {
	files := []protoreflect.FileDescriptor{v1.File_capledger_v1_capledger_proto, v1.File_capledger_v1_shard_proto,
		v1.File_capledger_v1_console_proto, v1.File_capledger_v1_rollout_proto, v1.File_capledger_v1_audit_proto}
	var walk func(m protoreflect.MethodDescriptor, md protoreflect.MessageDescriptor, prefix string, batch bool, depth int)
	walk = func(m protoreflect.MethodDescriptor, md protoreflect.MessageDescriptor, prefix string, batch bool, depth int) {
		if depth > 4 {
			return
		}
		for i := 0; i < md.Fields().Len(); i++ {
			fd := md.Fields().Get(i)
			switch {
			case fd.IsMap():
				if unitMaps[fd.Name()] && fd.MapKey().Kind() == protoreflect.StringKind {
					cases = append(cases, textCase{method: m, path: prefix + string(fd.Name()), field: fd, holder: md.FullName(), batch: batch, unitName: true})
				} else {
					unclassified = append(unclassified, string(md.FullName())+"."+string(fd.Name()))
				}
			case fd.Kind() == protoreflect.StringKind:
				if _, ok := textBounds[fd.Name()]; ok {
					path := prefix + string(fd.Name())
					if fd.IsList() {
						path += "[0]"
					}
					cases = append(cases, textCase{method: m, path: path, field: fd, holder: md.FullName(), batch: batch})
				} else if !textFree[fd.Name()] {
					unclassified = append(unclassified, string(md.FullName())+"."+string(fd.Name()))
				}
			case fd.Kind() == protoreflect.MessageKind:
				p := prefix + string(fd.Name())
				if fd.IsList() {
					p += "[0]"
				}
				isBatch := batch || (fd.Name() == "requests" && strings.HasSuffix(string(md.Name()), "BatchRequest"))
				if isBatch && !batch {
					p = "" // an item's error names the item's own fields
				} else {
					p += "."
				}
				walk(m, fd.Message(), p, isBatch, depth+1)
			}
		}
	}
	for _, f := range files {
		for i := 0; i < f.Services().Len(); i++ {
			methods := f.Services().Get(i).Methods()
			for j := 0; j < methods.Len(); j++ {
				walk(methods.Get(j), methods.Get(j).Input(), "", false, 0)
			}
		}
	}
	return cases, unclassified
}

// request builds c's request: every ruled field along the path set to a
// good value, the case's field to marker (a list gets one item).
func (c textCase) request(t *testing.T, marker string) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(c.method.Input().FullName())
	if err != nil {
		t.Fatal(err)
	}
	msg := mt.New()
	c.fill(msg, strings.Split(strings.ReplaceAll(c.path, "[0]", ""), "."), marker)
	return msg.Interface()
}

// fill sets the good values of m's ruled fields and follows path.
func (c textCase) fill(m protoreflect.Message, path []string, marker string) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if c.unitName && fd.IsMap() && len(path) == 1 && string(fd.Name()) == path[0] {
			m.Mutable(fd).Map().Set(protoreflect.ValueOfString(marker).MapKey(), protoreflect.ValueOfInt64(1))
			continue
		}
		if fd.Kind() != protoreflect.StringKind || fd.IsMap() {
			continue
		}
		if _, ok := textBounds[fd.Name()]; !ok {
			continue
		}
		v := "good-" + string(fd.Name())
		if len(path) == 1 && string(fd.Name()) == path[0] {
			v = marker
		}
		if fd.IsList() {
			m.Mutable(fd).List().Append(protoreflect.ValueOfString(v))
		} else {
			m.Set(fd, protoreflect.ValueOfString(v))
		}
	}
	if len(path) < 2 && !c.batch {
		return
	}
	// The message field on the path (or a batch's items, whose own path
	// starts inside the item).
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			continue
		}
		rest := path
		if len(path) >= 2 && string(fd.Name()) == path[0] {
			rest = path[1:]
		} else if !(c.batch && fd.Name() == "requests" && m.Descriptor().FullName() == c.method.Input().FullName()) {
			continue
		}
		var child protoreflect.Message
		if fd.IsList() {
			child = m.Mutable(fd).List().AppendMutable().Message()
		} else {
			child = m.Mutable(fd).Message()
		}
		inner := c
		inner.batch = false
		inner.fill(child, rest, marker)
		return
	}
}

// The bad values of each field: over its bound (when it has one), a NUL
// byte, invalid UTF-8. The marker is replaced in the encoded request by
// the bad bytes of the same length (no protobuf or JSON encoder writes
// invalid UTF-8), so lengths in the encoding stay right.
type badText struct {
	name   string
	marker string
	bytes  string
	// json is bytes as JSON text (a NUL is escaped there).
	json string
	want string
}

func badTexts(bound int) []badText {
	out := []badText{
		{"NUL", "nul-marker", "nul\x00marker", `nul\u0000marker`, "contains a NUL byte"},
		{"invalid UTF-8", "utf-marker", "utf\xffmarker", "utf\xffmarker", ""},
	}
	if bound > 0 {
		long := strings.Repeat("L", bound+1)
		out = append(out, badText{"over-long", long, long, long, "is " + strconv.Itoa(bound+1) + " bytes long; at most " + strconv.Itoa(bound)})
	}
	return out
}

// storeDigest hashes every row of every table of the SQLite file through a
// connection of its own: equal digests mean nothing was written.
func storeDigest(t *testing.T, h *harness) [32]byte {
	t.Helper()
	// The subject index is written behind the commits (up to 10 s later):
	// its entries and its meta row change with no request at all.
	indexed, ok := h.store.(interface {
		SubjectIndexStatus() store.SubjectIndexStatus
	})
	if !ok {
		t.Fatalf("the store %T reports no subject index", h.store)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := indexed.SubjectIndexStatus()
		if st.Pending == 0 && !st.CatchingUp {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the subject index still waits to be written after 30 s: %+v", st)
		}
	}
	db, err := sql.Open("sqlite", h.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		rows.Scan(&name)
		tables = append(tables, name)
	}
	rows.Close()
	digest := sha256.New()
	for _, table := range tables {
		rows, err := db.Query(`SELECT * FROM "` + table + `"`)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		fmt.Fprintf(digest, "table %s\n", table)
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(digest, "%v\n", vals)
		}
		rows.Close()
	}
	var sum [32]byte
	copy(sum[:], digest.Sum(nil))
	return sum
}

// A subject, route, region, id or rollout name that is over its bound,
// or one of them or a unit name (a key of a units map) that holds a NUL
// byte or is not UTF-8, is refused by every method of every service that
// takes it (a unit name without quoting it), over Connect JSON (POST, and GET for the read
// methods), Connect protobuf and gRPC (grpc-go's direct methods and its
// bridge): 400 / gRPC 3 invalid_argument, with the documented reason for
// the length and NUL (invalid UTF-8 does not decode: no detail, as
// malformed JSON), and nothing is written to the store. Batch items are
// refused as their item's error (200), the others proceeding.
func TestEveryNamingFieldIsBounded(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, shards: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	h.ok("Reserve", reserveBody("before", 1), adminToken)

	cases, unclassified := textCases(t)
	if len(unclassified) > 0 {
		t.Fatalf("string fields of requests with no rule (give them one in server/fields.go and here): %v", unclassified)
	}
	methods := map[string]bool{}
	for _, c := range cases {
		methods[string(c.method.FullName())] = true
	}
	for _, m := range []string{"capledger.v1.LedgerService.GetAccount", "capledger.v1.LedgerService.ListPolicies",
		"capledger.v1.ShardService.ListShards", "capledger.v1.ConsoleService.ListAccountStandings",
		"capledger.v1.ConsoleService.GetFairness", "capledger.v1.RolloutService.ShadowReport",
		"capledger.v1.LedgerService.ReserveBatch", "capledger.v1.LedgerService.SettleBatch",
		"capledger.v1.RolloutService.CarveLegacyBudget", "capledger.v1.LedgerService.PublishPolicy"} {
		if !methods[m] {
			t.Errorf("no case for %s", m)
		}
	}
	unitMethods := map[string]bool{}
	for _, c := range cases {
		if c.unitName {
			unitMethods[string(c.method.Name())] = true
		}
	}
	for _, m := range []string{"Reserve", "ReserveBatch", "Settle", "SettleBatch", "RecordUsage", "IssueShard", "ReconcileShard", "CarveLegacyBudget"} {
		if !unitMethods[m] {
			t.Errorf("no unit name case for %s", m)
		}
	}

	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	protocols.SetHTTP1(true)
	h2 := &http.Client{Transport: &http.Transport{Protocols: protocols, TLSClientConfig: &tls.Config{}}, Timeout: 10 * time.Second}
	t.Cleanup(h2.CloseIdleConnections)
	h2only := new(http.Protocols)
	h2only.SetUnencryptedHTTP2(true)
	grpcClient := &http.Client{Transport: &http.Transport{Protocols: h2only, TLSClientConfig: &tls.Config{}}, Timeout: 10 * time.Second}
	t.Cleanup(grpcClient.CloseIdleConnections)

	before := storeDigest(t, h)
	calls, refusedReserves := 0, 0
	for _, c := range cases {
		service, method := c.method.Parent().FullName(), c.method.Name()
		path := "/" + string(service) + "/" + string(method)
		reason := server.ReasonInvalidCommand
		if r, ok := textReasons[c.holder]; ok {
			reason = r
		}
		for _, bad := range badTexts(c.bound()) {
			msg := c.request(t, bad.marker)
			jsonBody, err := protojson.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			protoBody, err := proto.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			jsonBody = bytes.Replace(jsonBody, []byte(bad.marker), []byte(bad.json), 1)
			protoBody = bytes.Replace(protoBody, []byte(bad.marker), []byte(bad.bytes), 1)
			name := fmt.Sprintf("%s %s %s", path, c.path, bad.name)
			type answer struct {
				protocol string
				code     string
				reason   string
				message  string
			}
			var answers []answer
			connectCall := func(protocol string, req *http.Request) {
				req.Header.Set("Authorization", "Bearer "+adminToken)
				resp, err := h2.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", name, protocol, err)
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				a := answer{protocol: protocol}
				if c.batch {
					a.code, a.reason, a.message = batchItemError(t, raw, resp.Header.Get("Content-Type"), method)
					if resp.StatusCode != http.StatusOK {
						a.code = fmt.Sprintf("HTTP %d %s", resp.StatusCode, raw)
					}
				} else {
					a.code, a.reason, a.message = connectError(raw)
					if resp.StatusCode != http.StatusBadRequest {
						a.code = fmt.Sprintf("HTTP %d %s", resp.StatusCode, raw)
					}
				}
				answers = append(answers, a)
			}
			post := func(contentType string, body []byte) *http.Request {
				req, _ := http.NewRequest(http.MethodPost, h.url+path, bytes.NewReader(body))
				req.Header.Set("Content-Type", contentType)
				return req
			}
			connectCall("connect+json", post("application/json", jsonBody))
			connectCall("connect+proto", post("application/proto", protoBody))
			if isReadOnly(c.method) {
				q := url.Values{"encoding": {"proto"}, "base64": {"1"}, "message": {base64.RawURLEncoding.EncodeToString(protoBody)}}
				req, _ := http.NewRequest(http.MethodGet, h.url+path+"?"+q.Encode(), nil)
				connectCall("connect GET", req)
			}
			// gRPC over HTTP/2 to the front (grpc-go).
			frame := make([]byte, 5+len(protoBody))
			binary.BigEndian.PutUint32(frame[1:5], uint32(len(protoBody)))
			copy(frame[5:], protoBody)
			req, _ := http.NewRequest(http.MethodPost, h.url+path, bytes.NewReader(frame))
			req.Header.Set("Content-Type", "application/grpc")
			req.Header.Set("TE", "trailers")
			req.Header.Set("Authorization", "Bearer "+adminToken)
			resp, err := grpcClient.Do(req)
			if err != nil {
				t.Fatalf("%s grpc: %v", name, err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			a := answer{protocol: "grpc"}
			if c.batch {
				if len(raw) < 5 {
					a.code = "no message: grpc-status " + resp.Trailer.Get("Grpc-Status") + resp.Header.Get("Grpc-Status") + " " + resp.Trailer.Get("Grpc-Message") + resp.Header.Get("Grpc-Message")
				} else {
					a.code, a.reason, a.message = batchItemError(t, raw[5:], "application/proto", method)
				}
			} else {
				a.code, a.reason, a.message = grpcStatus(t, resp)
			}
			answers = append(answers, a)
			calls += len(answers)
			if bad.want != "" && (method == "Reserve" || method == "ReserveBatch") {
				refusedReserves += 3 // connect JSON, connect protobuf, gRPC
			}

			for _, a := range answers {
				wantReason := reason
				if bad.want == "" {
					wantReason = "" // does not decode: no detail
				}
				if bad.want == "" && c.batch {
					// The whole batch does not decode.
					if !strings.Contains(a.code, "invalid_argument") && !strings.Contains(a.code, "grpc-status 3 ") && a.code != "HTTP 400" {
						if !strings.HasPrefix(a.code, "HTTP 400") {
							t.Errorf("%s over %s: %s; want 400 invalid_argument", name, a.protocol, a.code)
						}
					}
					continue
				}
				if a.code != "invalid_argument" || a.reason != wantReason || !strings.Contains(a.message, c.refusal(bad.want)) && bad.want != "" {
					t.Errorf("%s over %s: %s %s %q; want invalid_argument %s naming %q", name, a.protocol, a.code, a.reason, a.message, wantReason, c.refusal(bad.want))
				} else if c.unitName && bad.want != "" && (strings.Contains(a.message, bad.marker) || strings.Contains(a.message, "marker")) {
					t.Errorf("%s over %s: %q echoes the unit name", name, a.protocol, a.message)
				} else if bad.want == "" && !strings.Contains(strings.ToLower(a.message), "utf-8") {
					t.Errorf("%s over %s: %q does not say UTF-8", name, a.protocol, a.message)
				}
			}
		}
	}
	if after := storeDigest(t, h); after != before {
		t.Errorf("the refused requests changed the store")
	}
	t.Logf("%d fields, %d calls", len(cases), calls)
	// Refused commands count as their handlers count them (those that
	// do not decode are not commands).
	want := fmt.Sprintf(`capledger_commands_total{kind="reserve",outcome="invalid_command"} %d`, refusedReserves)
	if got := grep(h.get("/metrics"), `kind="reserve",outcome="invalid_command"`); got != want {
		t.Errorf("metrics %q, want %q", got, want)
	}
	if got := h.ok("GetReservation", `{"reservationId":"before"}`, adminToken); field(got, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Errorf("the reservation made before: %v", got)
	}
}

// isReadOnly reports whether m may be called with GET (no side effects).
func isReadOnly(m protoreflect.MethodDescriptor) bool {
	opts, ok := m.Options().(*descriptorpb.MethodOptions)
	return ok && opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS
}

// connectError reads a Connect error body: code, detail reason, message.
func connectError(raw []byte) (code, reason, message string) {
	var body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Details []struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"details"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return "undecodable " + string(raw), "", ""
	}
	for _, d := range body.Details {
		if d.Type == "capledger.v1.ErrorDetail" {
			b, _ := base64.RawStdEncoding.DecodeString(strings.TrimRight(d.Value, "="))
			var detail v1.ErrorDetail
			if proto.Unmarshal(b, &detail) == nil {
				reason = detail.GetReason()
			}
		}
	}
	return body.Code, reason, body.Message
}

// grpcStatus reads a gRPC answer's status: code name, detail reason,
// message.
func grpcStatus(t *testing.T, resp *http.Response) (code, reason, message string) {
	get := func(k string) string {
		if v := resp.Trailer.Get(k); v != "" {
			return v
		}
		return resp.Header.Get(k)
	}
	n, _ := strconv.Atoi(get("Grpc-Status"))
	if n != 3 {
		return fmt.Sprintf("grpc-status %d %s", n, get("Grpc-Message")), "", ""
	}
	message, _ = url.PathUnescape(get("Grpc-Message"))
	if bin := get("Grpc-Status-Details-Bin"); bin != "" {
		b, _ := base64.RawStdEncoding.DecodeString(strings.TrimRight(bin, "="))
		var st spb.Status
		if proto.Unmarshal(b, &st) == nil {
			for _, d := range st.GetDetails() {
				var detail v1.ErrorDetail
				if d.MessageIs(&detail) && d.UnmarshalTo(&detail) == nil {
					reason = detail.GetReason()
				}
			}
		}
	}
	return "invalid_argument", reason, message
}

// batchItemError reads the first item's error of a batch answer.
func batchItemError(t *testing.T, raw []byte, contentType string, method protoreflect.Name) (code, reason, message string) {
	var item *v1.ItemError
	switch method {
	case "ReserveBatch":
		var resp v1.ReserveBatchResponse
		if err := unmarshalAnswer(raw, contentType, &resp); err != nil || len(resp.GetOutcomes()) == 0 {
			return "undecodable " + string(raw), "", ""
		}
		item = resp.GetOutcomes()[0].GetError()
	case "SettleBatch":
		var resp v1.SettleBatchResponse
		if err := unmarshalAnswer(raw, contentType, &resp); err != nil || len(resp.GetOutcomes()) == 0 {
			return "undecodable " + string(raw), "", ""
		}
		item = resp.GetOutcomes()[0].GetError()
	default:
		t.Fatalf("batch method %s", method)
	}
	if item == nil {
		return "no item error in " + string(raw), "", ""
	}
	return item.GetCode(), item.GetDetail().GetReason(), item.GetMessage()
}

func unmarshalAnswer(raw []byte, contentType string, m proto.Message) error {
	if strings.Contains(contentType, "json") {
		return protojson.Unmarshal(raw, m)
	}
	return proto.Unmarshal(raw, m)
}
