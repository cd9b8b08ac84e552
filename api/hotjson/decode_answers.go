package hotjson

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// The answers' decoders, for the SDK's JSON protocol. They take the form
// the server (hotjson or protojson) writes; anything else goes to
// protojson, as for the requests.

// decodeAnswer decodes the hot answers; it reports false for any other
// message or input.
func (d *decoder) answer(m any) (handled, ok bool) {
	switch m := m.(type) {
	case *v1.ReserveResponse:
		return true, d.reserveResponse(m)
	case *v1.ReserveBatchResponse:
		var seen uint8 // not m.Outcomes != nil: an empty list leaves it nil
		return true, d.object(func(key []byte) bool {
			if string(key) != "outcomes" || !d.once(&seen, 1) {
				return false
			}
			return d.array(func() bool {
				o := &v1.ReserveOutcome{}
				m.Outcomes = append(m.Outcomes, o)
				return d.object(func(key []byte) bool {
					if o.Outcome != nil {
						return false // a oneof set twice: protojson refuses it
					}
					switch string(key) {
					case "ok":
						r := &v1.ReserveResponse{}
						o.Outcome = &v1.ReserveOutcome_Ok{Ok: r}
						return d.reserveResponse(r)
					case "error":
						r := &v1.ItemError{}
						o.Outcome = &v1.ReserveOutcome_Error{Error: r}
						return d.itemError(r)
					}
					return false
				})
			})
		})
	case *v1.StartResponse:
		var seen uint8
		return true, d.object(func(key []byte) bool {
			switch string(key) {
			case "reservation":
				return d.once(&seen, 1) && d.reservation(&m.Reservation)
			case "replayed":
				return d.once(&seen, 2) && d.boolean(&m.Replayed)
			}
			return false
		})
	case *v1.SettleResponse:
		return true, d.settleResponse(m)
	case *v1.SettleBatchResponse:
		var seen uint8 // not m.Outcomes != nil: an empty list leaves it nil
		return true, d.object(func(key []byte) bool {
			if string(key) != "outcomes" || !d.once(&seen, 1) {
				return false
			}
			return d.array(func() bool {
				o := &v1.SettleOutcome{}
				m.Outcomes = append(m.Outcomes, o)
				return d.object(func(key []byte) bool {
					if o.Outcome != nil {
						return false
					}
					switch string(key) {
					case "ok":
						r := &v1.SettleResponse{}
						o.Outcome = &v1.SettleOutcome_Ok{Ok: r}
						return d.settleResponse(r)
					case "error":
						r := &v1.ItemError{}
						o.Outcome = &v1.SettleOutcome_Error{Error: r}
						return d.itemError(r)
					}
					return false
				})
			})
		})
	case *v1.ReleaseResponse:
		var seen uint8
		return true, d.object(func(key []byte) bool {
			switch string(key) {
			case "reservation":
				return d.once(&seen, 1) && d.reservation(&m.Reservation)
			case "replayed":
				return d.once(&seen, 2) && d.boolean(&m.Replayed)
			case "refundedUnits", "refunded_units":
				return d.once(&seen, 4) && d.units(&m.RefundedUnits)
			}
			return false
		})
	}
	return false, false
}

func (d *decoder) reserveResponse(m *v1.ReserveResponse) bool {
	var seen uint8
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "reservation":
			return d.once(&seen, 1) && d.reservation(&m.Reservation)
		case "replayed":
			return d.once(&seen, 2) && d.boolean(&m.Replayed)
		case "policyGeneration", "policy_generation":
			return d.once(&seen, 4) && d.uint64(&m.PolicyGeneration)
		case "shadowRejected", "shadow_rejected":
			return d.once(&seen, 8) && d.boolean(&m.ShadowRejected)
		case "shadowRejection", "shadow_rejection":
			return d.once(&seen, 16) && d.rejection(&m.ShadowRejection)
		}
		return false
	})
}

func (d *decoder) settleResponse(m *v1.SettleResponse) bool {
	var seen uint8
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "reservation":
			return d.once(&seen, 1) && d.reservation(&m.Reservation)
		case "replayed":
			return d.once(&seen, 2) && d.boolean(&m.Replayed)
		case "refundedUnits", "refunded_units":
			return d.once(&seen, 4) && d.units(&m.RefundedUnits)
		}
		return false
	})
}

func (d *decoder) itemError(m *v1.ItemError) bool {
	var seen uint8
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "code":
			return d.once(&seen, 1) && d.str(&m.Code)
		case "message":
			return d.once(&seen, 2) && d.str(&m.Message)
		case "rejection":
			return d.once(&seen, 4) && d.rejection(&m.Rejection)
		case "detail":
			if !d.once(&seen, 8) || d.null() {
				return false
			}
			m.Detail = &v1.ErrorDetail{}
			var inner uint8
			return d.object(func(key []byte) bool {
				switch string(key) {
				case "reason":
					return d.once(&inner, 1) && d.str(&m.Detail.Reason)
				case "reservation":
					return d.once(&inner, 2) && d.reservation(&m.Detail.Reservation)
				case "field":
					return d.once(&inner, 4) && d.str(&m.Detail.Field)
				}
				return false
			})
		}
		return false
	})
}

func (d *decoder) rejection(out **v1.RejectionDetail) bool {
	if d.null() {
		return false
	}
	m := &v1.RejectionDetail{}
	*out = m
	var seen uint8
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "policyGeneration", "policy_generation":
			return d.once(&seen, 1) && d.uint64(&m.PolicyGeneration)
		case "limitingDimension", "limiting_dimension":
			return d.once(&seen, 2) && d.str(&m.LimitingDimension)
		case "retryAfter", "retry_after":
			return d.once(&seen, 4) && d.duration(&m.RetryAfter)
		case "reason":
			return d.once(&seen, 8) && d.str(&m.Reason)
		}
		return false
	})
}

func (d *decoder) reservation(out **v1.Reservation) bool {
	if d.null() {
		return false
	}
	m := &v1.Reservation{}
	*out = m
	var seen uint32
	once := func(bit uint32) bool {
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	}
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "schema":
			return once(1<<1) && d.str(&m.Schema)
		case "reservationId", "reservation_id":
			return once(1<<2) && d.str(&m.ReservationId)
		case "requestDigest", "request_digest":
			return once(1<<3) && d.str(&m.RequestDigest)
		case "subject":
			return once(1<<4) && d.str(&m.Subject)
		case "route":
			return once(1<<5) && d.str(&m.Route)
		case "region":
			return once(1<<6) && d.str(&m.Region)
		case "policyGeneration", "policy_generation":
			return once(1<<7) && d.uint64(&m.PolicyGeneration)
		case "accountingEpoch", "accounting_epoch":
			return once(1<<8) && d.timestamp(&m.AccountingEpoch)
		case "reservedUnits", "reserved_units":
			return once(1<<9) && d.units(&m.ReservedUnits)
		case "actualUnits", "actual_units":
			return once(1<<10) && d.units(&m.ActualUnits)
		case "overdraftUnits", "overdraft_units":
			return once(1<<11) && d.units(&m.OverdraftUnits)
		case "operationId", "operation_id":
			return once(1<<12) && d.str(&m.OperationId)
		case "state":
			if !once(1 << 13) {
				return false
			}
			name, ok := d.raw()
			if !ok {
				return false // a number, or escaped: protojson's
			}
			v, known := v1.ReservationState_value[string(name)]
			m.State = v1.ReservationState(v)
			return known
		case "createdAt", "created_at":
			return once(1<<14) && d.timestamp(&m.CreatedAt)
		case "expiresAt", "expires_at":
			return once(1<<15) && d.timestamp(&m.ExpiresAt)
		case "startedAt", "started_at":
			return once(1<<16) && d.timestamp(&m.StartedAt)
		case "executionDeadline", "execution_deadline":
			return once(1<<17) && d.timestamp(&m.ExecutionDeadline)
		case "finishedAt", "finished_at":
			return once(1<<18) && d.timestamp(&m.FinishedAt)
		case "breach":
			return once(1<<19) && d.boolean(&m.Breach)
		case "usageUnknownAt", "usage_unknown_at":
			return once(1<<20) && d.timestamp(&m.UsageUnknownAt)
		case "retired":
			return once(1<<21) && d.boolean(&m.Retired)
		}
		return false
	})
}

func (d *decoder) null() bool {
	return d.pos < len(d.data) && d.data[d.pos] == 'n'
}

func (d *decoder) boolean(out *bool) bool {
	rest := d.data[d.pos:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		*out = true
		d.pos += 4
	case len(rest) >= 5 && string(rest[:5]) == "false":
		*out = false
		d.pos += 5
	default:
		return false
	}
	// "trueish" is not JSON; the next byte must end the value.
	return d.pos == len(d.data) || !isLetterOrDigit(d.data[d.pos])
}

func isLetterOrDigit(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

// uint64 reads a non-negative integer that fits int64 (policy
// generations do), bare or quoted.
func (d *decoder) uint64(out *uint64) bool {
	if d.pos < len(d.data) && (d.data[d.pos] == '-' || d.pos+1 < len(d.data) && d.data[d.pos+1] == '-') {
		return false
	}
	v, ok := d.int64()
	*out = uint64(v)
	return ok
}

// timestamp reads RFC 3339 in UTC ("Z") with 0 to 9 fractional digits,
// and parses it as protojson does.
func (d *decoder) timestamp(out **timestamppb.Timestamp) bool {
	s, ok := d.raw()
	if !ok || len(s) < 20 || s[len(s)-1] != 'Z' {
		return false
	}
	if len(s) > 20 && (s[19] != '.' || len(s)-21 > 9 || len(s) == 21) {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, string(s))
	if err != nil {
		return false
	}
	secs := t.Unix()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds {
		return false
	}
	*out = &timestamppb.Timestamp{Seconds: secs, Nanos: int32(t.Nanosecond())}
	return true
}

// duration reads -?(0|[1-9][0-9]*)(\.[0-9]{1,9})?s within protojson's range.
func (d *decoder) duration(out **durationpb.Duration) bool {
	s, ok := d.raw()
	if !ok || len(s) < 2 || s[len(s)-1] != 's' {
		return false
	}
	s = s[:len(s)-1]
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	i := 0
	var secs int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		if i >= 12 {
			return false
		}
		secs = secs*10 + int64(s[i]-'0')
		i++
	}
	if i == 0 || (i > 1 && s[0] == '0') || secs > maxDurationSeconds {
		return false
	}
	var nanos int64
	if i < len(s) {
		if s[i] != '.' || len(s)-i-1 < 1 || len(s)-i-1 > 9 {
			return false
		}
		digits := 0
		for _, c := range s[i+1:] {
			if c < '0' || c > '9' {
				return false
			}
			nanos = nanos*10 + int64(c-'0')
			digits++
		}
		for ; digits < 9; digits++ {
			nanos *= 10
		}
	}
	if neg {
		secs, nanos = -secs, -nanos
	}
	*out = &durationpb.Duration{Seconds: secs, Nanos: int32(nanos)}
	return true
}
