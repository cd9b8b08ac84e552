package postgres_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The linearizability model of one account as its gateways see it: a
// capacity with no refill, reservations that hold units until they are
// settled, and settles that give back reserved minus actual.

// accountInput is one client operation.
type accountInput struct {
	settle bool   // false: reserve
	id     string // reservation id
	units  int64  // reserve: estimate; settle: the reservation's estimate
	actual int64  // settle: actual usage (never above the estimate here)
}

// accountOutput is what the client saw.
type accountOutput struct {
	ok       bool // reserve admitted / settle recorded
	rejected bool // reserve refused for capacity (429)
	unknown  bool // the answer was lost: applied or not
}

// accountState is available capacity and the reservations holding units.
type accountState struct {
	available int64
	held      map[string]int64
}

func (s accountState) with(available int64, id string, units int64, hold bool) accountState {
	held := maps.Clone(s.held)
	if hold {
		held[id] = units
	} else {
		delete(held, id)
	}
	return accountState{available: available, held: held}
}

func (s accountState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "available=%d held=[", s.available)
	for _, id := range slices.Sorted(maps.Keys(s.held)) {
		fmt.Fprintf(&b, " %s:%d", id, s.held[id])
	}
	b.WriteString(" ]")
	return b.String()
}

// accountModel returns the porcupine model for an account of the given
// capacity. A reserve that fits must be admitted and one that does not must
// be refused; a lost answer allows both the applied and the unapplied
// state.
func accountModel(capacity int64) porcupine.Model {
	model := &porcupine.NondeterministicModel{
		Init: func() []interface{} {
			return []interface{}{accountState{available: capacity, held: map[string]int64{}}}
		},
		Step: func(state, input, output interface{}) []interface{} {
			s, in, out := state.(accountState), input.(accountInput), output.(accountOutput)
			if !in.settle {
				fits := in.units <= s.available
				applied := func() accountState { return s.with(s.available-in.units, in.id, in.units, true) }
				switch {
				case out.unknown && fits:
					return []interface{}{s, applied()}
				case out.unknown:
					return []interface{}{s}
				case out.ok && fits:
					return []interface{}{applied()}
				case out.rejected && !fits:
					return []interface{}{s}
				}
				return nil
			}
			units, holds := s.held[in.id]
			if !holds {
				return nil // a settle of a reservation that holds nothing
			}
			settled := s.with(s.available+units-in.actual, in.id, 0, false)
			switch {
			case out.unknown:
				return []interface{}{s, settled}
			case out.ok:
				return []interface{}{settled}
			}
			return nil
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(accountState), b.(accountState)
			return x.available == y.available && maps.Equal(x.held, y.held)
		},
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(accountInput), output.(accountOutput)
			verb := fmt.Sprintf("reserve %s %d", in.id, in.units)
			if in.settle {
				verb = fmt.Sprintf("settle %s %d/%d", in.id, in.actual, in.units)
			}
			switch {
			case out.unknown:
				return verb + " -> ?"
			case out.rejected:
				return verb + " -> 429"
			}
			return verb + " -> ok"
		},
		DescribeState: func(state interface{}) string { return state.(accountState).String() },
	}
	return model.ToModel()
}

// history records client operations with their real-time intervals.
type history struct {
	start time.Time
	ops   []porcupine.Operation
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

// neverReturned is the return time of an operation whose answer was lost:
// later than everything, so porcupine may place it anywhere after its call.
const neverReturned = int64(1) << 62

// The model itself must be able to fail: an oversold history (two 600s
// admitted from 1,000 with both holding) is illegal, the seed's story is
// legal, and a lost answer admits both outcomes.
func TestAccountModel(t *testing.T) {
	op := func(client int, call, ret int64, in accountInput, out accountOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
	}
	ok, rejected, unknown := accountOutput{ok: true}, accountOutput{rejected: true}, accountOutput{unknown: true}
	cases := []struct {
		name  string
		ops   []porcupine.Operation
		legal bool
	}{
		{"seed: one of three 600s admitted, settle 200, then 600 fits", []porcupine.Operation{
			op(0, 0, 10, accountInput{id: "a", units: 600}, ok),
			op(1, 1, 11, accountInput{id: "b", units: 600}, rejected),
			op(2, 2, 12, accountInput{id: "c", units: 600}, rejected),
			op(0, 20, 30, accountInput{settle: true, id: "a", units: 600, actual: 200}, ok),
			op(1, 40, 50, accountInput{id: "d", units: 800}, ok),
		}, true},
		{"oversold: two concurrent 600s both admitted", []porcupine.Operation{
			op(0, 0, 10, accountInput{id: "a", units: 600}, ok),
			op(1, 1, 11, accountInput{id: "b", units: 600}, ok),
		}, false},
		{"rejected although it fit", []porcupine.Operation{
			op(0, 0, 10, accountInput{id: "a", units: 200}, rejected),
		}, false},
		{"stale read: rejected after the settle that freed it returned", []porcupine.Operation{
			op(0, 0, 10, accountInput{id: "a", units: 900}, ok),
			op(0, 20, 30, accountInput{settle: true, id: "a", units: 900, actual: 0}, ok),
			op(1, 40, 50, accountInput{id: "b", units: 900}, rejected),
		}, false},
		{"lost answer may have applied", []porcupine.Operation{
			op(0, 0, neverReturned, accountInput{id: "a", units: 600}, unknown),
			op(1, 20, 30, accountInput{id: "b", units: 600}, rejected),
		}, true},
		{"lost answer may not have applied", []porcupine.Operation{
			op(0, 0, neverReturned, accountInput{id: "a", units: 600}, unknown),
			op(1, 20, 30, accountInput{id: "b", units: 600}, ok),
		}, true},
	}
	for _, tc := range cases {
		got := porcupine.CheckOperations(accountModel(1000), tc.ops)
		if got != tc.legal {
			t.Errorf("%s: linearizable %v, want %v", tc.name, got, tc.legal)
		}
	}
}
