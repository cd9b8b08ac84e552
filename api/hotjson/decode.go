// Package hotjson is a JSON codec for the LedgerService's hot messages
// (Reserve, Start, Settle, Release and the two batches, requests and
// answers) written out by hand, without protobuf reflection. protojson was
// about a third of the server's CPU on JSON batches; the messages it
// spends it on have a handful of fields each.
//
// It never decides anything protojson would decide differently. Decoding
// takes a fast path only for the plain JSON every client sends (known
// field names, strings without escapes, integers without exponents, no
// nulls, no duplicates); on anything else it reports false and the caller
// runs protojson on the same bytes, which then accepts or refuses with
// its own error (an unknown field, a malformed number, invalid UTF-8).
// Encoding writes what protojson writes (field order, omitted zero values,
// 64-bit integers as strings, sorted map keys, RFC 3339 timestamps,
// durations as seconds), apart from protojson's deliberately random
// spaces; for anything it does not cover it reports false too. The tests
// hold both paths to protojson on generated and fuzzed messages.
package hotjson

import (
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// Decode decodes data into m when m is a hot message (a request the
// server reads or an answer the SDK reads) and data is plain JSON, and
// reports whether it did. On false, m may be partly
// written: decode data with protojson, which resets m first.
func Decode(data []byte, m proto.Message) bool {
	d := decoder{data: data}
	var ok bool
	switch m := m.(type) {
	case *v1.ReserveRequest:
		ok = d.reserveRequest(m)
	case *v1.ReserveBatchRequest:
		var seen uint8 // not m.Requests != nil: an empty list leaves it nil
		ok = d.object(func(key []byte) bool {
			switch string(key) {
			case "requests":
				return d.once(&seen, 1) && d.array(func() bool {
					r := &v1.ReserveRequest{}
					m.Requests = append(m.Requests, r)
					return d.reserveRequest(r)
				})
			}
			return false
		})
	case *v1.StartRequest:
		var seen uint8
		ok = d.object(func(key []byte) bool {
			switch string(key) {
			case "reservationId", "reservation_id":
				return d.once(&seen, 1) && d.str(&m.ReservationId)
			case "operationId", "operation_id":
				return d.once(&seen, 2) && d.str(&m.OperationId)
			}
			return false
		})
	case *v1.SettleRequest:
		ok = d.settleRequest(m)
	case *v1.SettleBatchRequest:
		var seen uint8 // not m.Requests != nil: an empty list leaves it nil
		ok = d.object(func(key []byte) bool {
			switch string(key) {
			case "requests":
				return d.once(&seen, 1) && d.array(func() bool {
					r := &v1.SettleRequest{}
					m.Requests = append(m.Requests, r)
					return d.settleRequest(r)
				})
			}
			return false
		})
	case *v1.ReleaseRequest:
		var seen uint8
		ok = d.object(func(key []byte) bool {
			switch string(key) {
			case "reservationId", "reservation_id":
				return d.once(&seen, 1) && d.str(&m.ReservationId)
			}
			return false
		})
	default:
		var handled bool
		if handled, ok = d.answer(m); !handled {
			return false
		}
	}
	if !ok {
		return false
	}
	d.space()
	return d.pos == len(d.data)
}

func (d *decoder) reserveRequest(m *v1.ReserveRequest) bool {
	var seen uint8
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "reservationId", "reservation_id":
			return d.once(&seen, 1) && d.str(&m.ReservationId)
		case "requestDigest", "request_digest":
			return d.once(&seen, 2) && d.str(&m.RequestDigest)
		case "subject":
			return d.once(&seen, 4) && d.str(&m.Subject)
		case "route":
			return d.once(&seen, 8) && d.str(&m.Route)
		case "region":
			return d.once(&seen, 16) && d.str(&m.Region)
		case "units":
			return d.once(&seen, 32) && d.units(&m.Units)
		case "legacyDecision", "legacy_decision":
			return d.once(&seen, 64) && d.str(&m.LegacyDecision)
		}
		return false
	})
}

func (d *decoder) settleRequest(m *v1.SettleRequest) bool {
	var seen uint8
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "reservationId", "reservation_id":
			return d.once(&seen, 1) && d.str(&m.ReservationId)
		case "operationId", "operation_id":
			return d.once(&seen, 2) && d.str(&m.OperationId)
		case "actualUnits", "actual_units":
			return d.once(&seen, 4) && d.units(&m.ActualUnits)
		}
		return false
	})
}

// decoder reads plain JSON from data; every method returns false on
// anything outside the plain form, which sends the caller to protojson.
type decoder struct {
	data []byte
	pos  int
}

// once marks a field seen and reports false if it was already: protojson
// refuses a field given twice (also under its two names).
func (d *decoder) once(seen *uint8, bit uint8) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

func (d *decoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) consume(c byte) bool {
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

// object reads {"key": value, ...}, calling field with each key (the
// decoder then stands before the value, which field must read).
func (d *decoder) object(field func(key []byte) bool) bool {
	if !d.consume('{') {
		return false
	}
	if d.consume('}') {
		return true
	}
	for {
		d.space()
		key, ok := d.raw()
		if !ok || !d.consume(':') {
			return false
		}
		d.space()
		if !field(key) {
			return false
		}
		if d.consume(',') {
			continue
		}
		return d.consume('}')
	}
}

// array reads [elem, ...], calling elem for each element.
func (d *decoder) array(elem func() bool) bool {
	if !d.consume('[') {
		return false
	}
	if d.consume(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.consume(',') {
			continue
		}
		return d.consume(']')
	}
}

// raw reads a string without escapes and returns its bytes (valid UTF-8,
// no control characters), without copying.
func (d *decoder) raw() ([]byte, bool) {
	if d.pos >= len(d.data) || d.data[d.pos] != '"' {
		return nil, false
	}
	start := d.pos + 1
	ascii := true
	for i := start; i < len(d.data); i++ {
		c := d.data[i]
		switch {
		case c == '"':
			s := d.data[start:i]
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			d.pos = i + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
	}
	return nil, false
}

func (d *decoder) str(out *string) bool {
	s, ok := d.raw()
	if ok {
		*out = string(s)
	}
	return ok
}

// units reads a map of unit names to int64s, each a JSON integer or a
// string of one (protojson's two forms of a 64-bit integer).
func (d *decoder) units(out *map[string]int64) bool {
	if d.pos < len(d.data) && d.data[d.pos] == 'n' {
		return false // null: protojson's business
	}
	m := make(map[string]int64, 2)
	ok := d.object(func(key []byte) bool {
		if _, dup := m[string(key)]; dup {
			return false
		}
		v, ok := d.int64()
		if ok {
			m[string(key)] = v
		}
		return ok
	})
	*out = m
	return ok
}

// int64 reads -?(0|[1-9][0-9]*), bare or quoted, within int64.
func (d *decoder) int64() (int64, bool) {
	quoted := d.pos < len(d.data) && d.data[d.pos] == '"'
	if quoted {
		d.pos++
	}
	neg := d.pos < len(d.data) && d.data[d.pos] == '-'
	if neg {
		d.pos++
	}
	start := d.pos
	var v uint64
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		if c < '0' || c > '9' {
			break
		}
		if d.pos-start >= 19 {
			return 0, false // 20 digits or more: leave it to protojson
		}
		v = v*10 + uint64(c-'0')
		d.pos++
	}
	digits := d.pos - start
	if digits == 0 || (digits > 1 && d.data[start] == '0') || (neg && v == 0) {
		return 0, false
	}
	if d.pos < len(d.data) {
		switch d.data[d.pos] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	if quoted {
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return 0, false
		}
		d.pos++
	}
	if neg {
		if v > 1<<63 {
			return 0, false
		}
		return -int64(v), true
	}
	if v > 1<<63-1 {
		return 0, false
	}
	return int64(v), true
}
