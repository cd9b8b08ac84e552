package replicatest

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The linearizability model of one account as its gateways see it: a
// capacity with no refill, reservations that hold units until they are
// settled, and settles that give back reserved minus actual.

// AccountInput is one client operation.
type AccountInput struct {
	Settle bool   // false: reserve
	ID     string // reservation id
	Units  int64  // reserve: estimate; settle: the reservation's estimate
	Actual int64  // settle: actual usage (never above the estimate here)
}

// AccountOutput is what the client saw.
type AccountOutput struct {
	OK       bool // reserve admitted / settle recorded
	Rejected bool // reserve refused for capacity (429)
	Unknown  bool // the answer was lost: applied or not
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

// AccountModel returns the porcupine model for an account of the given
// capacity. A reserve that fits must be admitted and one that does not must
// be refused; a lost answer allows both the applied and the unapplied
// state.
func AccountModel(capacity int64) porcupine.Model {
	model := &porcupine.NondeterministicModel{
		Init: func() []interface{} {
			return []interface{}{accountState{available: capacity, held: map[string]int64{}}}
		},
		Step: func(state, input, output interface{}) []interface{} {
			s, in, out := state.(accountState), input.(AccountInput), output.(AccountOutput)
			if !in.Settle {
				fits := in.Units <= s.available
				applied := func() accountState { return s.with(s.available-in.Units, in.ID, in.Units, true) }
				switch {
				case out.Unknown && fits:
					return []interface{}{s, applied()}
				case out.Unknown:
					return []interface{}{s}
				case out.OK && fits:
					return []interface{}{applied()}
				case out.Rejected && !fits:
					return []interface{}{s}
				}
				return nil
			}
			units, holds := s.held[in.ID]
			if !holds {
				return nil // a settle of a reservation that holds nothing
			}
			settled := s.with(s.available+units-in.Actual, in.ID, 0, false)
			switch {
			case out.Unknown:
				return []interface{}{s, settled}
			case out.OK:
				return []interface{}{settled}
			}
			return nil
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(accountState), b.(accountState)
			return x.available == y.available && maps.Equal(x.held, y.held)
		},
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(AccountInput), output.(AccountOutput)
			verb := fmt.Sprintf("reserve %s %d", in.ID, in.Units)
			if in.Settle {
				verb = fmt.Sprintf("settle %s %d/%d", in.ID, in.Actual, in.Units)
			}
			switch {
			case out.Unknown:
				return verb + " -> ?"
			case out.Rejected:
				return verb + " -> 429"
			}
			return verb + " -> ok"
		},
		DescribeState: func(state interface{}) string { return state.(accountState).String() },
	}
	return model.ToModel()
}

// NeverReturned is the return time of an operation whose answer was lost:
// later than everything, so porcupine may place it anywhere after its call.
const NeverReturned = int64(1) << 62

// History records client operations with their real-time intervals; its
// methods may be called from many goroutines.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

// NewHistory starts a history whose times count from now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time to give as an operation's call time.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Record adds an operation called at call that has just returned out (an
// unknown outcome never returns) and reports how many the history holds.
func (h *History) Record(clientID int, call int64, in AccountInput, out AccountOutput) int {
	ret := h.Now()
	if out.Unknown {
		ret = NeverReturned
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: clientID, Call: call, Return: ret, Input: in, Output: out})
	return len(h.ops)
}

// Counts returns how many operations the history holds, how many of them
// had their answer lost and how many were refused for capacity.
func (h *History) Counts() (ops, unknown, rejected int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, op := range h.ops {
		switch out := op.Output.(AccountOutput); {
		case out.Unknown:
			unknown++
		case out.Rejected:
			rejected++
		}
	}
	return len(h.ops), unknown, rejected
}

// CheckLinearizable fails the test unless the history is linearizable
// for model (AccountModel, or one partitioned over several accounts),
// checked within timeout; an illegal history is written out as
// porcupine's visualization, named after the test. It returns how long
// the check took.
func (h *History) CheckLinearizable(t testing.TB, model porcupine.Model, timeout time.Duration) time.Duration {
	t.Helper()
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
	checked := time.Since(start)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
		path := filepath.Join(os.TempDir(), fmt.Sprintf("capledger-%s-%d.html", name, time.Now().UnixNano()))
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Errorf("history of %d operations is not linearizable; visualization: %s", len(ops), path)
		} else {
			t.Errorf("history of %d operations is not linearizable", len(ops))
		}
	default:
		t.Errorf("linearizability check of %d operations did not finish in %s", len(ops), timeout)
	}
	return checked
}
