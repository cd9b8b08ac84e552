package hotjson

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// gen makes random hot messages, with the awkward values (escapes,
// non-ASCII, extreme integers, timestamps and durations of every
// precision) more often than chance would.
type gen struct{ r *rand.Rand }

func (g gen) str() string {
	pieces := []string{"", "a", "tenant-7", "chat.generate", "ü", "日本", "\"", "\\", "\n", "\t", "\x01", "\x1f", "/", "<>&", "\u2028", "\ufffd", "sha256:0f"}
	if g.r.IntN(4) == 0 {
		return ""
	}
	var b strings.Builder
	for range g.r.IntN(4) + 1 {
		b.WriteString(pieces[g.r.IntN(len(pieces))])
	}
	return b.String()
}

func (g gen) int64() int64 {
	switch g.r.IntN(6) {
	case 0:
		return 0
	case 1:
		return math.MaxInt64
	case 2:
		return math.MinInt64
	case 3:
		return -g.r.Int64N(1000)
	}
	return g.r.Int64N(1 << 40)
}

func (g gen) units() map[string]int64 {
	if g.r.IntN(4) == 0 {
		return nil
	}
	m := map[string]int64{}
	for range g.r.IntN(12) + 1 {
		m[g.str()] = g.int64()
	}
	return m
}

func (g gen) timestamp() *timestamppb.Timestamp {
	if g.r.IntN(3) == 0 {
		return nil
	}
	nanos := []int32{0, 1, 500_000_000, 123_000, 999_999_999, 120_000_000, 7_000}[g.r.IntN(7)]
	return &timestamppb.Timestamp{Seconds: g.r.Int64N(maxTimestampSeconds-minTimestampSeconds) + minTimestampSeconds, Nanos: nanos}
}

func (g gen) duration() *durationpb.Duration {
	if g.r.IntN(3) == 0 {
		return nil
	}
	secs := g.r.Int64N(maxDurationSeconds)
	nanos := []int32{0, 1, 500_000_000, 123_000, 999_999_999, 7_000}[g.r.IntN(6)]
	if g.r.IntN(3) == 0 {
		secs, nanos = -secs, -nanos
	}
	return &durationpb.Duration{Seconds: secs, Nanos: nanos}
}

func (g gen) reservation() *v1.Reservation {
	if g.r.IntN(4) == 0 {
		return nil
	}
	return &v1.Reservation{
		Schema: g.str(), ReservationId: g.str(), RequestDigest: g.str(), Subject: g.str(), Route: g.str(), Region: g.str(),
		PolicyGeneration: g.r.Uint64() >> g.r.IntN(64), AccountingEpoch: g.timestamp(),
		ReservedUnits: g.units(), ActualUnits: g.units(), OverdraftUnits: g.units(), OperationId: g.str(),
		State:     v1.ReservationState(g.r.IntN(13)), // 11 and 12 are not names: written as numbers
		CreatedAt: g.timestamp(), ExpiresAt: g.timestamp(), StartedAt: g.timestamp(), ExecutionDeadline: g.timestamp(),
		FinishedAt: g.timestamp(), Breach: g.r.IntN(2) == 0, UsageUnknownAt: g.timestamp(), Retired: g.r.IntN(2) == 0,
	}
}

func (g gen) rejection() *v1.RejectionDetail {
	if g.r.IntN(3) == 0 {
		return nil
	}
	return &v1.RejectionDetail{PolicyGeneration: g.r.Uint64N(100), LimitingDimension: g.str(), RetryAfter: g.duration(), Reason: g.str()}
}

func (g gen) itemError() *v1.ItemError {
	e := &v1.ItemError{Code: g.str(), Message: g.str(), Rejection: g.rejection()}
	if g.r.IntN(2) == 0 {
		e.Detail = &v1.ErrorDetail{Reason: g.str(), Reservation: g.reservation(), Field: g.str()}
	}
	return e
}

func (g gen) reserveResponse() *v1.ReserveResponse {
	return &v1.ReserveResponse{Reservation: g.reservation(), Replayed: g.r.IntN(2) == 0, PolicyGeneration: g.r.Uint64N(1 << 50),
		ShadowRejected: g.r.IntN(2) == 0, ShadowRejection: g.rejection()}
}

func (g gen) settleResponse() *v1.SettleResponse {
	return &v1.SettleResponse{Reservation: g.reservation(), Replayed: g.r.IntN(2) == 0, RefundedUnits: g.units()}
}

func (g gen) answer() proto.Message {
	switch g.r.IntN(6) {
	case 0:
		return g.reserveResponse()
	case 1:
		m := &v1.ReserveBatchResponse{}
		for range g.r.IntN(5) {
			switch g.r.IntN(3) {
			case 0:
				m.Outcomes = append(m.Outcomes, &v1.ReserveOutcome{Outcome: &v1.ReserveOutcome_Ok{Ok: g.reserveResponse()}})
			case 1:
				m.Outcomes = append(m.Outcomes, &v1.ReserveOutcome{Outcome: &v1.ReserveOutcome_Error{Error: g.itemError()}})
			default:
				m.Outcomes = append(m.Outcomes, []*v1.ReserveOutcome{{}, nil, {Outcome: &v1.ReserveOutcome_Ok{}}}[g.r.IntN(3)])
			}
		}
		return m
	case 2:
		return &v1.StartResponse{Reservation: g.reservation(), Replayed: g.r.IntN(2) == 0}
	case 3:
		return g.settleResponse()
	case 4:
		m := &v1.SettleBatchResponse{}
		for range g.r.IntN(5) {
			if g.r.IntN(2) == 0 {
				m.Outcomes = append(m.Outcomes, &v1.SettleOutcome{Outcome: &v1.SettleOutcome_Ok{Ok: g.settleResponse()}})
			} else {
				m.Outcomes = append(m.Outcomes, &v1.SettleOutcome{Outcome: &v1.SettleOutcome_Error{Error: g.itemError()}})
			}
		}
		return m
	}
	return &v1.ReleaseResponse{Reservation: g.reservation(), Replayed: g.r.IntN(2) == 0, RefundedUnits: g.units()}
}

func (g gen) reserveRequest() *v1.ReserveRequest {
	return &v1.ReserveRequest{ReservationId: g.str(), RequestDigest: g.str(), Subject: g.str(), Route: g.str(), Region: g.str(),
		Units: g.units(), LegacyDecision: g.str()}
}

func (g gen) settleRequest() *v1.SettleRequest {
	return &v1.SettleRequest{ReservationId: g.str(), OperationId: g.str(), ActualUnits: g.units()}
}

func (g gen) request() proto.Message {
	switch g.r.IntN(6) {
	case 0:
		return g.reserveRequest()
	case 1:
		m := &v1.ReserveBatchRequest{}
		for range g.r.IntN(4) {
			m.Requests = append(m.Requests, g.reserveRequest())
		}
		if g.r.IntN(8) == 0 {
			m.Requests = append(m.Requests, nil) // written as {}, read back as {}
		}
		return m
	case 2:
		return &v1.StartRequest{ReservationId: g.str(), OperationId: g.str()}
	case 3:
		return g.settleRequest()
	case 4:
		m := &v1.SettleBatchRequest{}
		for range g.r.IntN(4) {
			m.Requests = append(m.Requests, g.settleRequest())
		}
		return m
	}
	return &v1.ReleaseRequest{ReservationId: g.str()}
}

// Append writes, byte for byte, what protojson writes without its random
// spaces, for every hot answer and request.
func TestAppendWritesWhatProtojsonWrites(t *testing.T) {
	g := gen{rand.New(rand.NewPCG(1, 2))}
	for i := range 20000 {
		m := g.answer()
		if i%3 == 0 {
			m = g.request()
		}
		want, err := protojson.Marshal(m)
		if err != nil {
			t.Fatalf("protojson: %v", err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, want); err != nil {
			t.Fatal(err)
		}
		got, ok := Append([]byte("prefix"), m)
		if !ok {
			t.Fatalf("message %d: Append declined %v", i, m)
		}
		if !bytes.Equal(got, append([]byte("prefix"), compact.Bytes()...)) {
			t.Fatalf("message %d (%T):\n got %s\nwant %s", i, m, got[6:], compact.Bytes())
		}
	}
}

// Where protojson refuses to write a value, Append declines and leaves
// dst alone, so the caller gets protojson's error.
func TestAppendDeclinesWhatProtojsonRefuses(t *testing.T) {
	for _, m := range []proto.Message{
		&v1.StartResponse{Reservation: &v1.Reservation{Subject: "bad\xffutf8"}},
		&v1.SettleResponse{RefundedUnits: map[string]int64{"\xfe": 1}},
		&v1.ReleaseResponse{Reservation: &v1.Reservation{CreatedAt: &timestamppb.Timestamp{Seconds: maxTimestampSeconds + 1}}},
		&v1.ReserveResponse{ShadowRejection: &v1.RejectionDetail{RetryAfter: &durationpb.Duration{Seconds: 1, Nanos: -1}}},
	} {
		if _, err := protojson.Marshal(m); err == nil {
			t.Fatalf("protojson writes %v: the case tests nothing", m)
		}
		if out, ok := Append([]byte("x"), m); ok || string(out) != "x" {
			t.Errorf("Append(%v) = %q, %v; want to decline", m, out, ok)
		}
	}
	// Messages it does not cover are declined too.
	if _, ok := Append(nil, &v1.GetAccountRequest{}); ok {
		t.Error("Append took a message it does not cover")
	}
}

// Decode reads what protojson writes (under JSON names and proto names),
// into the message protojson reads: the requests (the server) and the
// answers (the SDK).
func TestDecodeReadsWhatProtojsonWrites(t *testing.T) {
	g := gen{rand.New(rand.NewPCG(3, 4))}
	fast := 0
	unnamedState := regexp.MustCompile(`"state":\s*[0-9]`)
	for i := range 20000 {
		m := g.request()
		if i%2 == 1 {
			m = g.answer()
		}
		data, err := protojson.MarshalOptions{UseProtoNames: i%2 == 0, Multiline: i%3 == 0}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got := m.ProtoReflect().New().Interface()
		if !Decode(data, got) {
			// Only escaped strings and states without a name leave the
			// fast path here.
			if !bytes.Contains(data, []byte(`\`)) && !unnamedState.Match(data) {
				t.Fatalf("message %d: Decode declined plain %s", i, data)
			}
			continue
		}
		fast++
		if !proto.Equal(got, m) {
			t.Fatalf("message %d: Decode(%s) = %v, want %v", i, data, got, m)
		}
	}
	if fast < 3000 {
		t.Fatalf("only %d of 20000 messages took the fast path", fast)
	}
}

// Off the plain form, Decode declines and protojson decides: unknown
// fields (refused by the strict codec), duplicates, nulls, escapes,
// numbers protojson reads or refuses itself, trailing garbage.
func TestDecodeLeavesTheUnusualToProtojson(t *testing.T) {
	for _, in := range []string{
		`{"reservationId":"r1","bogus":1}`,
		`{"reservationId":"r1","reservation_id":"r2"}`,
		`{"reservationId":null}`,
		`{"units":null}`,
		`{"reservationId":"r\u0031"}`,
		`{"units":{"tokens":1e3}}`,
		`{"units":{"tokens":1.0}}`,
		`{"units":{"tokens":"0x10"}}`,
		`{"units":{"tokens":01}}`,
		`{"units":{"tokens":-0}}`,
		`{"units":{"tokens":9223372036854775808}}`,
		`{"units":{"tokens":-9223372036854775809}}`,
		`{"units":{"tokens":12345678901234567890}}`,
		`{"units":{"tokens":1,"tokens":2}}`,
		`{"units":{"tokens":true}}`,
		`{"subject":"a\xffb"}`,
		`{"subject":"a` + "\x01" + `"}`,
		`{"subject":"a"} x`,
		`{"subject":"a",}`,
		`[]`,
		`{"reservationId":"r1"`,
	} {
		if Decode([]byte(in), &v1.ReserveRequest{}) {
			t.Errorf("Decode took %s", in)
		}
	}
	for _, in := range []string{
		`{"reservation":null}`,
		`{"replayed":truex}`,
		`{"replayed":"true"}`,
		`{"policyGeneration":"-1"}`,
		`{"reservation":{"state":5}}`,
		`{"reservation":{"state":"RESERVED"}}`,
		`{"reservation":{"createdAt":"2026-12-02T06:00:00+01:00"}}`,
		`{"reservation":{"createdAt":"2026-12-02T06:00:00.1234567891Z"}}`,
		`{"reservation":{"createdAt":"2026-02-30T06:00:00Z"}}`,
		`{"shadowRejection":{"retryAfter":"1.s"}}`,
		`{"shadowRejection":{"retryAfter":"+1s"}}`,
		`{"shadowRejection":{"retryAfter":"01s"}}`,
		`{"shadowRejection":{"retryAfter":"315576000001s"}}`,
	} {
		if Decode([]byte(in), &v1.ReserveResponse{}) {
			t.Errorf("Decode took %s", in)
		}
	}
	if Decode([]byte(`{"outcomes":[{"ok":{},"error":{}}]}`), &v1.ReserveBatchResponse{}) {
		t.Error("Decode took a oneof set twice")
	}
	// A batch's list given twice, the first time empty: protojson refuses
	// the duplicate field; the second list must not pass for the only one.
	for _, c := range []struct {
		in string
		m  proto.Message
	}{
		{`{"requests":[],"requests":[{"reservationId":"r1"}]}`, &v1.ReserveBatchRequest{}},
		{`{"requests":[],"requests":[{"reservationId":"r1"}]}`, &v1.SettleBatchRequest{}},
		{`{"outcomes":[],"outcomes":[{"ok":{}}]}`, &v1.ReserveBatchResponse{}},
		{`{"outcomes":[],"outcomes":[{"ok":{}}]}`, &v1.SettleBatchResponse{}},
	} {
		if Decode([]byte(c.in), c.m) {
			t.Errorf("Decode took %s into %T", c.in, c.m)
		}
	}
	// And the strict codec then answers with protojson's error.
	err := Codec{CodecName: "json", Strict: true}.Unmarshal([]byte(`{"reservationId":"r1","actualUnit":{"tokens":5}}`), &v1.SettleRequest{})
	if err == nil || !strings.Contains(err.Error(), `unknown field "actualUnit"`) {
		t.Errorf("strict codec on an unknown field: %v", err)
	}
	m := &v1.SettleRequest{}
	if err := (Codec{CodecName: "json"}).Unmarshal([]byte(`{"reservationId":"r1","newerField":{"tokens":5}}`), m); err != nil || m.ReservationId != "r1" {
		t.Errorf("lenient codec on an unknown field: %v, %v", err, m)
	}
	// Whitespace anywhere JSON allows it, and both integer forms.
	got := &v1.ReserveRequest{}
	if !Decode([]byte(" {\n\t\"subject\" : \"s\" ,\r\n \"units\" : { \"a\" : -5 , \"b\" : \"9223372036854775807\" } } \n"), got) ||
		got.Subject != "s" || got.Units["a"] != -5 || got.Units["b"] != math.MaxInt64 {
		t.Errorf("Decode with whitespace: %v", got)
	}
}

// Whatever Decode takes, protojson takes too, into the same message.
func FuzzDecodeAgreesWithProtojson(f *testing.F) {
	g := gen{rand.New(rand.NewPCG(5, 6))}
	for range 50 {
		data, _ := protojson.Marshal(g.request())
		f.Add(data)
	}
	for range 50 {
		data, _ := protojson.Marshal(g.answer())
		f.Add(data)
	}
	f.Add([]byte(`{"units":{"tokens":-0}}`))
	f.Add([]byte(`{"outcomes":[{"ok":{"reservation":{"createdAt":"2026-12-02T06:00:00.5Z","state":"RESERVATION_STATE_RESERVED"}}}]}`))
	f.Add([]byte(`{"shadowRejection":{"retryAfter":"-1.5s"},"replayed":true}`))
	f.Add([]byte(`{"requests":[{"subject":"a"},{}]}`))
	f.Add([]byte(`{"requests":[],"requests":[{}]}`))
	f.Add([]byte(`{"outcomes":[],"outcomes":[{}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []proto.Message{&v1.ReserveRequest{}, &v1.ReserveBatchRequest{}, &v1.StartRequest{},
			&v1.SettleRequest{}, &v1.SettleBatchRequest{}, &v1.ReleaseRequest{},
			&v1.ReserveResponse{}, &v1.ReserveBatchResponse{}, &v1.StartResponse{}, &v1.SettleResponse{},
			&v1.SettleBatchResponse{}, &v1.ReleaseResponse{}} {
			if !Decode(data, m) {
				continue
			}
			want := m.ProtoReflect().New().Interface()
			if err := protojson.Unmarshal(data, want); err != nil {
				t.Fatalf("Decode took %q into %T, protojson refuses it: %v", data, m, err)
			}
			if !proto.Equal(m, want) {
				t.Fatalf("Decode(%q) = %v, protojson reads %v", data, m, want)
			}
		}
	})
}
