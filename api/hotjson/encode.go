package hotjson

import (
	"cmp"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// Append appends the JSON of m to dst when m is a hot message (a request
// the SDK sends or an answer the server sends), and
// reports whether it did. On false (another message, or a value protojson
// refuses to write, such as invalid UTF-8 or a timestamp out of range)
// dst is returned unchanged: encode m with protojson.
func Append(dst []byte, m proto.Message) ([]byte, bool) {
	e := encoder{out: dst, ok: true}
	switch m := m.(type) {
	case *v1.ReserveResponse:
		e.reserveResponse(m)
	case *v1.ReserveBatchResponse:
		e.open()
		if len(m.Outcomes) > 0 {
			e.name("outcomes")
			e.out = append(e.out, '[')
			for i, o := range m.Outcomes {
				if i > 0 {
					e.out = append(e.out, ',')
				}
				e.open()
				// A nil outcome or a nil message in one is written as
				// empty, as protojson writes it.
				switch o := o.GetOutcome().(type) {
				case *v1.ReserveOutcome_Ok:
					e.name("ok")
					e.reserveResponse(cmp.Or(o.Ok, emptyReserveResponse))
				case *v1.ReserveOutcome_Error:
					e.name("error")
					e.itemError(cmp.Or(o.Error, emptyItemError))
				}
				e.close()
			}
			e.out = append(e.out, ']')
		}
		e.close()
	case *v1.StartResponse:
		e.open()
		e.reservation("reservation", m.Reservation)
		e.boolean("replayed", m.Replayed)
		e.close()
	case *v1.SettleResponse:
		e.settleResponse(m)
	case *v1.SettleBatchResponse:
		e.open()
		if len(m.Outcomes) > 0 {
			e.name("outcomes")
			e.out = append(e.out, '[')
			for i, o := range m.Outcomes {
				if i > 0 {
					e.out = append(e.out, ',')
				}
				e.open()
				// A nil outcome or a nil message in one is written as
				// empty, as protojson writes it.
				switch o := o.GetOutcome().(type) {
				case *v1.SettleOutcome_Ok:
					e.name("ok")
					e.settleResponse(cmp.Or(o.Ok, emptySettleResponse))
				case *v1.SettleOutcome_Error:
					e.name("error")
					e.itemError(cmp.Or(o.Error, emptyItemError))
				}
				e.close()
			}
			e.out = append(e.out, ']')
		}
		e.close()
	case *v1.ReserveRequest:
		e.reserveRequest(m)
	case *v1.ReserveBatchRequest:
		e.open()
		if len(m.Requests) > 0 {
			e.name("requests")
			e.out = append(e.out, '[')
			for i, r := range m.Requests {
				if i > 0 {
					e.out = append(e.out, ',')
				}
				e.reserveRequest(cmp.Or(r, emptyReserveRequest))
			}
			e.out = append(e.out, ']')
		}
		e.close()
	case *v1.StartRequest:
		e.open()
		e.string("reservationId", m.ReservationId)
		e.string("operationId", m.OperationId)
		e.close()
	case *v1.SettleRequest:
		e.settleRequest(m)
	case *v1.SettleBatchRequest:
		e.open()
		if len(m.Requests) > 0 {
			e.name("requests")
			e.out = append(e.out, '[')
			for i, r := range m.Requests {
				if i > 0 {
					e.out = append(e.out, ',')
				}
				e.settleRequest(cmp.Or(r, emptySettleRequest))
			}
			e.out = append(e.out, ']')
		}
		e.close()
	case *v1.ReleaseRequest:
		e.open()
		e.string("reservationId", m.ReservationId)
		e.close()
	case *v1.ReleaseResponse:
		e.open()
		e.reservation("reservation", m.Reservation)
		e.boolean("replayed", m.Replayed)
		e.units("refundedUnits", m.RefundedUnits)
		e.close()
	default:
		return dst, false
	}
	if !e.ok {
		return dst, false
	}
	return e.out, true
}

// Empty messages stand in for nil ones (read only).
var (
	emptyReserveResponse = &v1.ReserveResponse{}
	emptySettleResponse  = &v1.SettleResponse{}
	emptyItemError       = &v1.ItemError{}
	emptyReserveRequest  = &v1.ReserveRequest{}
	emptySettleRequest   = &v1.SettleRequest{}
)

// encoder writes JSON objects. first says whether the object being
// written has no field yet (for the commas); ok turns false on a value
// protojson would refuse.
type encoder struct {
	out   []byte
	first bool
	ok    bool
}

func (e *encoder) open() {
	e.out = append(e.out, '{')
	e.first = true
}

func (e *encoder) close() {
	e.out = append(e.out, '}')
	e.first = false
}

// name writes a field's name (a constant, which needs no escaping).
func (e *encoder) name(n string) {
	if !e.first {
		e.out = append(e.out, ',')
	}
	e.first = false
	e.out = append(e.out, '"')
	e.out = append(e.out, n...)
	e.out = append(e.out, '"', ':')
}

func (e *encoder) reserveRequest(m *v1.ReserveRequest) {
	e.open()
	e.string("reservationId", m.ReservationId)
	e.string("requestDigest", m.RequestDigest)
	e.string("subject", m.Subject)
	e.string("route", m.Route)
	e.string("region", m.Region)
	e.units("units", m.Units)
	e.string("legacyDecision", m.LegacyDecision)
	e.close()
}

func (e *encoder) settleRequest(m *v1.SettleRequest) {
	e.open()
	e.string("reservationId", m.ReservationId)
	e.string("operationId", m.OperationId)
	e.units("actualUnits", m.ActualUnits)
	e.close()
}

func (e *encoder) reserveResponse(m *v1.ReserveResponse) {
	e.open()
	e.reservation("reservation", m.Reservation)
	e.boolean("replayed", m.Replayed)
	e.uint64("policyGeneration", m.PolicyGeneration)
	e.boolean("shadowRejected", m.ShadowRejected)
	e.rejection("shadowRejection", m.ShadowRejection)
	e.close()
}

func (e *encoder) settleResponse(m *v1.SettleResponse) {
	e.open()
	e.reservation("reservation", m.Reservation)
	e.boolean("replayed", m.Replayed)
	e.units("refundedUnits", m.RefundedUnits)
	e.close()
}

func (e *encoder) itemError(m *v1.ItemError) {
	e.open()
	e.string("code", m.Code)
	e.string("message", m.Message)
	e.rejection("rejection", m.Rejection)
	if m.Detail != nil {
		e.name("detail")
		e.open()
		e.string("reason", m.Detail.Reason)
		e.reservation("reservation", m.Detail.Reservation)
		e.string("field", m.Detail.Field)
		e.close()
	}
	e.close()
}

func (e *encoder) rejection(name string, m *v1.RejectionDetail) {
	if m == nil {
		return
	}
	e.name(name)
	e.open()
	e.uint64("policyGeneration", m.PolicyGeneration)
	e.string("limitingDimension", m.LimitingDimension)
	e.duration("retryAfter", m.RetryAfter)
	e.string("reason", m.Reason)
	e.close()
}

func (e *encoder) reservation(name string, m *v1.Reservation) {
	if m == nil {
		return
	}
	e.name(name)
	e.open()
	e.string("schema", m.Schema)
	e.string("reservationId", m.ReservationId)
	e.string("requestDigest", m.RequestDigest)
	e.string("subject", m.Subject)
	e.string("route", m.Route)
	e.string("region", m.Region)
	e.uint64("policyGeneration", m.PolicyGeneration)
	e.timestamp("accountingEpoch", m.AccountingEpoch)
	e.units("reservedUnits", m.ReservedUnits)
	e.units("actualUnits", m.ActualUnits)
	e.units("overdraftUnits", m.OverdraftUnits)
	e.string("operationId", m.OperationId)
	if m.State != 0 {
		e.name("state")
		if n, ok := v1.ReservationState_name[int32(m.State)]; ok {
			e.out = append(e.out, '"')
			e.out = append(e.out, n...)
			e.out = append(e.out, '"')
		} else {
			e.out = strconv.AppendInt(e.out, int64(m.State), 10)
		}
	}
	e.timestamp("createdAt", m.CreatedAt)
	e.timestamp("expiresAt", m.ExpiresAt)
	e.timestamp("startedAt", m.StartedAt)
	e.timestamp("executionDeadline", m.ExecutionDeadline)
	e.timestamp("finishedAt", m.FinishedAt)
	e.boolean("breach", m.Breach)
	e.timestamp("usageUnknownAt", m.UsageUnknownAt)
	e.boolean("retired", m.Retired)
	e.close()
}

func (e *encoder) boolean(name string, v bool) {
	if v {
		e.name(name)
		e.out = append(e.out, "true"...)
	}
}

func (e *encoder) uint64(name string, v uint64) {
	if v != 0 {
		e.name(name)
		e.out = append(e.out, '"')
		e.out = strconv.AppendUint(e.out, v, 10)
		e.out = append(e.out, '"')
	}
}

func (e *encoder) string(name, v string) {
	if v != "" {
		e.name(name)
		e.quote(v)
	}
}

// quote writes v as a JSON string escaped as protojson escapes it.
func (e *encoder) quote(v string) {
	e.out = append(e.out, '"')
	start := 0
	for i := 0; i < len(v); {
		c := v[i]
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(v[i:])
			if r == utf8.RuneError && n == 1 {
				e.ok = false // protojson refuses invalid UTF-8
				return
			}
			i += n
			continue
		}
		if c >= ' ' && c != '"' && c != '\\' {
			i++
			continue
		}
		e.out = append(e.out, v[start:i]...)
		switch c {
		case '"', '\\':
			e.out = append(e.out, '\\', c)
		case '\b':
			e.out = append(e.out, '\\', 'b')
		case '\f':
			e.out = append(e.out, '\\', 'f')
		case '\n':
			e.out = append(e.out, '\\', 'n')
		case '\r':
			e.out = append(e.out, '\\', 'r')
		case '\t':
			e.out = append(e.out, '\\', 't')
		default:
			const hex = "0123456789abcdef"
			e.out = append(e.out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	e.out = append(e.out, v[start:]...)
	e.out = append(e.out, '"')
}

// units writes a unit map with its keys sorted and its values as strings.
func (e *encoder) units(name string, m map[string]int64) {
	if len(m) == 0 {
		return
	}
	e.name(name)
	e.out = append(e.out, '{')
	if len(m) == 1 {
		for k, v := range m {
			e.quote(k)
			e.out = append(e.out, ':', '"')
			e.out = strconv.AppendInt(e.out, v, 10)
			e.out = append(e.out, '"')
		}
		e.out = append(e.out, '}')
		return
	}
	var stack [8]string
	keys := stack[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			e.out = append(e.out, ',')
		}
		e.quote(k)
		e.out = append(e.out, ':', '"')
		e.out = strconv.AppendInt(e.out, m[k], 10)
		e.out = append(e.out, '"')
	}
	e.out = append(e.out, '}')
}

// Limits of protojson's well-known types (0001-01-01 to 9999-12-31, and
// 10,000 years of duration).
const (
	minTimestampSeconds  = -62135596800
	maxTimestampSeconds  = 253402300799
	maxDurationSeconds   = 315576000000
	nanosPerSecond       = 1_000_000_000
	timestampLayoutNanos = "2006-01-02T15:04:05.000000000"
)

// timestamp writes RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.
func (e *encoder) timestamp(name string, t *timestamppb.Timestamp) {
	if t == nil {
		return
	}
	if t.Seconds < minTimestampSeconds || t.Seconds > maxTimestampSeconds || t.Nanos < 0 || t.Nanos > nanosPerSecond {
		e.ok = false
		return
	}
	e.name(name)
	e.out = append(e.out, '"')
	start := len(e.out)
	e.out = time.Unix(t.Seconds, int64(t.Nanos)).UTC().AppendFormat(e.out, timestampLayoutNanos)
	e.out = trimFraction(e.out, start)
	e.out = append(e.out, 'Z', '"')
}

// duration writes seconds with 0, 3, 6 or 9 fractional digits and "s".
// A whole second of nanos (which protojson writes as ten digits) is left
// to protojson.
func (e *encoder) duration(name string, d *durationpb.Duration) {
	if d == nil {
		return
	}
	secs, nanos := d.Seconds, int64(d.Nanos)
	if secs < -maxDurationSeconds || secs > maxDurationSeconds || nanos <= -nanosPerSecond || nanos >= nanosPerSecond ||
		(secs > 0 && nanos < 0) || (secs < 0 && nanos > 0) {
		e.ok = false
		return
	}
	e.name(name)
	e.out = append(e.out, '"')
	start := len(e.out)
	if secs < 0 || nanos < 0 {
		e.out = append(e.out, '-')
		secs, nanos = -secs, -nanos
	}
	e.out = strconv.AppendInt(e.out, secs, 10)
	e.out = append(e.out, '.')
	var frac [9]byte
	for i := 8; i >= 0; i-- {
		frac[i] = byte('0' + nanos%10)
		nanos /= 10
	}
	e.out = append(e.out, frac[:]...)
	e.out = trimFraction(e.out, start)
	e.out = append(e.out, 's', '"')
}

// trimFraction drops trailing groups of three zeros from a value ending in
// nine fractional digits (and the point when all nine are zero), as
// protojson does; start is where the value begins.
func trimFraction(out []byte, start int) []byte {
	for range 2 {
		if n := len(out); n-start >= 3 && string(out[n-3:]) == "000" {
			out = out[:n-3]
		}
	}
	if n := len(out); n-start >= 4 && string(out[n-4:]) == ".000" {
		out = out[:n-4]
	}
	return out
}
