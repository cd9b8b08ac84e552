package hotjson

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// benchMessages are what a batch of 100 reserves sends and gets back, and
// a single reserve, as capledger bench sends them.
func benchMessages() (req, resp, one, oneResp proto.Message) {
	now := timestamppb.New(time.Date(2026, 12, 2, 6, 0, 0, 123456789, time.UTC))
	reserve := func(i int) *v1.ReserveRequest {
		return &v1.ReserveRequest{ReservationId: fmt.Sprintf("01JEXAMPLE%016d", i), Subject: "bench-0", Route: "bench",
			RequestDigest: "sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b", Units: map[string]int64{"tokens": 10}}
	}
	answer := func(i int) *v1.ReserveResponse {
		r := reserve(i)
		return &v1.ReserveResponse{PolicyGeneration: 3, Reservation: &v1.Reservation{
			Schema: "limitReservation.v1", ReservationId: r.ReservationId, RequestDigest: r.RequestDigest, Subject: r.Subject,
			Route: r.Route, Region: "global", PolicyGeneration: 3, AccountingEpoch: now, ReservedUnits: r.Units,
			State: v1.ReservationState_RESERVATION_STATE_RESERVED, CreatedAt: now, ExpiresAt: now}}
	}
	batch, answers := &v1.ReserveBatchRequest{}, &v1.ReserveBatchResponse{}
	for i := range 100 {
		batch.Requests = append(batch.Requests, reserve(i))
		answers.Outcomes = append(answers.Outcomes, &v1.ReserveOutcome{Outcome: &v1.ReserveOutcome_Ok{Ok: answer(i)}})
	}
	return batch, answers, reserve(0), answer(0)
}

// BenchmarkCodec compares the codec with protojson on the same messages:
// go test -run '^$' -bench Codec -benchmem ./api/hotjson/
func BenchmarkCodec(b *testing.B) {
	batch, answers, one, oneAnswer := benchMessages()
	for _, c := range []struct {
		name string
		req  proto.Message
		resp proto.Message
	}{{"reserve", one, oneAnswer}, {"batch100", batch, answers}} {
		data, _ := protojson.Marshal(c.req)
		b.Run(c.name+"/decode/protojson", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := c.req.ProtoReflect().New().Interface()
				if err := protojson.Unmarshal(data, m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/decode/hotjson", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := c.req.ProtoReflect().New().Interface()
				if !Decode(data, m) {
					b.Fatal("declined")
				}
			}
		})
		b.Run(c.name+"/encode/protojson", func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			for b.Loop() {
				var err error
				if buf, err = (protojson.MarshalOptions{}).MarshalAppend(buf[:0], c.resp); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/encode/hotjson", func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			for b.Loop() {
				var ok bool
				if buf, ok = Append(buf[:0], c.resp); !ok {
					b.Fatal("declined")
				}
			}
		})
	}
}
