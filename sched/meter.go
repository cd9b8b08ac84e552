package sched

import (
	"errors"
	"math"
	"sort"
	"sync"
)

// Meter measures how fair a dispatcher was, over a window of events that
// starts at NewMeter or StartWindow. It is fed Enqueued, Dispatched and
// Settled events, by a Scheduler (Config.Meter) or by any other dispatcher
// under test, and computes the two metrics of docs/FAIRNESS.md within each
// priority level:
//
//   - RFE, the relative fairness error: the largest |S_i/w_i - S_j/w_j|
//     between tenants i, j of one level that were backlogged (had a request
//     queued) during the whole window;
//   - per tenant e_i = |A_i - F_i| / F_i, A_i the tenant's share of its
//     level's service in the window and F_i its weighted max-min fair share
//     given every tenant's demand.
//
// S_i, the service of tenant i in the window, is the actual cost of the
// requests dispatched in the window, counting a request not settled yet at
// its estimate. The demand of tenant i is unlimited if it has been
// backlogged during the whole window (it always had work waiting, so its
// demand never limited its service; a client that keeps its queue full asks
// for exactly what it is given, and counting only that would call any split
// fair); otherwise it is S_i plus the estimated cost it still has queued.
// All cost accounting is int64; only the metrics are float64.
//
// A Meter keeps a tenant only while it matters to the metrics: StartWindow
// drops a tenant that has nothing queued and had no event in the window
// ending nor in the one before it (such a tenant has no service, demand or
// backlog in the new window, so RFE and Snapshot do not change).
//
// A Meter is safe for concurrent use: a server may call Snapshot while a
// dispatcher feeds it.
type Meter struct {
	mu          sync.Mutex
	window      uint64
	tenants     map[string]*meterTenant
	tenantsPeak int // for compactMap
	inflight    map[string]meterDispatch
	// keepIdle disables dropping idle tenants; tests compare the metrics
	// with and without it.
	keepIdle bool
}

type meterTenant struct {
	name     string
	priority int
	weight   int64

	queued     int   // requests waiting now
	queuedCost int64 // their estimated cost

	// Counters of the current window.
	settledCost     int64 // actual cost of requests dispatched and settled in the window
	unsettledCost   int64 // estimated cost of requests dispatched in the window, not settled yet
	backloggedSince bool  // queued > 0 at every moment since the window started

	lastEvent uint64 // the window of the tenant's last event
}

type meterDispatch struct {
	t        *meterTenant
	window   uint64
	estimate int64
}

// TenantFairness is one tenant's line of a Meter snapshot.
type TenantFairness struct {
	Tenant   string
	Priority int
	Weight   int64
	// Served is S_i: actual cost dispatched in the window (estimates for
	// requests not settled yet).
	Served int64
	// Demand is Served plus the estimated cost still queued. The fair share
	// uses it only if Backlogged is false.
	Demand int64
	// Backlogged: the tenant had a request queued at every moment of the
	// window, so its demand counts as unlimited.
	Backlogged bool
	// Share is A_i = Served / the level's total Served.
	Share float64
	// FairShare is F_i, the weighted max-min fair share of the level's total
	// Served given every tenant's Demand.
	FairShare float64
	// Error is e_i = |Share - FairShare| / FairShare; 0 when FairShare is 0.
	Error float64
}

// NewMeter returns a Meter with an empty first window.
func NewMeter() *Meter {
	return &Meter{
		tenants:  make(map[string]*meterTenant),
		inflight: make(map[string]meterDispatch),
	}
}

func (m *Meter) tenant(name string) *meterTenant {
	t := m.tenants[name]
	if t == nil {
		t = &meterTenant{name: name, weight: 1}
		m.tenants[name] = t
		m.tenantsPeak = max(m.tenantsPeak, len(m.tenants))
	}
	t.lastEvent = m.window
	return t
}

// Enqueued records that a request of estimatedCost joined the tenant's
// queue; priority and weight are the tenant's current ones (a weight below
// 1 is taken as 1).
func (m *Meter) Enqueued(tenant string, priority int, weight, estimatedCost int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tenant(tenant)
	t.priority = priority
	t.weight = max(weight, 1)
	t.queued++
	t.queuedCost += estimatedCost
}

// Dispatched records that a queued request of the tenant was dispatched.
// A tenant whose queue becomes empty stops counting as backlogged for the
// rest of the window.
func (m *Meter) Dispatched(reservationID, tenant string, estimatedCost int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tenant(tenant)
	if t.queued > 0 {
		t.queued--
		t.queuedCost -= estimatedCost
	}
	if t.queued == 0 {
		t.backloggedSince = false
	}
	t.unsettledCost += estimatedCost
	m.inflight[reservationID] = meterDispatch{t: t, window: m.window, estimate: estimatedCost}
}

// Settled records the actual cost of a dispatched request. A request
// dispatched before the current window only leaves the in-flight set; an
// unknown id is ignored.
func (m *Meter) Settled(reservationID string, actualCost int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.inflight[reservationID]
	if !ok {
		return
	}
	delete(m.inflight, reservationID)
	if d.window != m.window {
		return
	}
	d.t.lastEvent = m.window
	d.t.unsettledCost -= d.estimate
	d.t.settledCost += actualCost
}

// StartWindow ends the current window and starts a new one: service
// counters restart at zero and a tenant counts as backlogged in the new
// window if it has a request queued now. A tenant with nothing queued and no
// event in the window ending or the one before is dropped (a settle of a
// request it dispatched before then is ignored, as any settle of an earlier
// window is).
func (m *Meter) StartWindow() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.window++
	for name, t := range m.tenants {
		if t.queued == 0 && t.lastEvent+2 < m.window && !m.keepIdle {
			delete(m.tenants, name)
			continue
		}
		t.settledCost, t.unsettledCost = 0, 0
		t.backloggedSince = t.queued > 0
	}
	m.tenants = compactMap(m.tenants, &m.tenantsPeak)
}

// RFE returns the relative fairness error of the current window: the
// largest |S_i/w_i - S_j/w_j| over pairs of tenants of the same priority
// level that have both been backlogged since the window started; 0 if no
// level has two such tenants.
func (m *Meter) RFE() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	type span struct{ lo, hi float64 }
	spans := make(map[int]*span)
	for _, t := range m.tenants {
		if !t.backloggedSince {
			continue
		}
		x := float64(t.settledCost+t.unsettledCost) / float64(t.weight)
		sp := spans[t.priority]
		if sp == nil {
			spans[t.priority] = &span{x, x}
			continue
		}
		sp.lo, sp.hi = math.Min(sp.lo, x), math.Max(sp.hi, x)
	}
	rfe := 0.0
	for _, sp := range spans {
		rfe = math.Max(rfe, sp.hi-sp.lo)
	}
	return rfe
}

// Snapshot returns the fairness of every tenant with demand or service in
// the current window, sorted by priority (highest first) then tenant name.
// Each level is measured on its own: its capacity is what its tenants were
// served. The result is a copy the caller owns (e.g. to export Error as a
// gauge per tenant).
func (m *Meter) Snapshot() []TenantFairness {
	m.mu.Lock()
	out := make([]TenantFairness, 0, len(m.tenants))
	for _, t := range m.tenants {
		served := t.settledCost + t.unsettledCost
		if served == 0 && t.queuedCost == 0 {
			continue
		}
		out = append(out, TenantFairness{
			Tenant:     t.name,
			Priority:   t.priority,
			Weight:     t.weight,
			Served:     served,
			Demand:     served + t.queuedCost,
			Backlogged: t.backloggedSince,
		})
	}
	m.mu.Unlock()

	sort.Slice(out, func(i, j int) bool {
		if out[i].Priority != out[j].Priority {
			return out[i].Priority > out[j].Priority
		}
		return out[i].Tenant < out[j].Tenant
	})
	for lo := 0; lo < len(out); {
		hi := lo
		for hi < len(out) && out[hi].Priority == out[lo].Priority {
			hi++
		}
		fillLevel(out[lo:hi])
		lo = hi
	}
	return out
}

// fillLevel computes Share, FairShare and Error for the tenants of one level.
func fillLevel(level []TenantFairness) {
	capacity := 0.0
	demands := make([]float64, len(level))
	weights := make([]float64, len(level))
	for i, tf := range level {
		capacity += float64(tf.Served)
		demands[i] = float64(tf.Demand)
		if tf.Backlogged {
			demands[i] = math.Inf(1)
		}
		weights[i] = float64(tf.Weight)
	}
	if capacity == 0 {
		return
	}
	alloc, err := WeightedMaxMinShares(capacity, demands, weights)
	if err != nil {
		panic("sched: meter holds an invalid weight or demand: " + err.Error())
	}
	for i := range level {
		tf := &level[i]
		tf.Share = float64(tf.Served) / capacity
		tf.FairShare = alloc[i] / capacity
		if alloc[i] > 0 {
			tf.Error = math.Abs(float64(tf.Served)-alloc[i]) / alloc[i]
		}
	}
}

// ErrInvalidShares: WeightedMaxMinShares got slices of different lengths,
// a weight that is not positive and finite, a negative or NaN demand, or a
// capacity that is negative, NaN or infinite.
var ErrInvalidShares = errors.New("sched: invalid demands, weights or capacity")

// WeightedMaxMinShares divides capacity between flows with the given
// demands and weights by weighted max-min fairness (water filling): no flow
// gets more than it demands, and capacity a flow does not use is shared by
// the others in proportion to their weights. alloc[i] is flow i's
// allocation, in capacity units; the allocations sum to min(capacity,
// sum of demands). A demand may be +Inf: a flow that takes all it is given.
// It returns ErrInvalidShares (and nil) for slices of different lengths, a
// weight that is not positive and finite, a negative or NaN demand, or a
// capacity that is negative, NaN or infinite.
func WeightedMaxMinShares(capacity float64, demands, weights []float64) ([]float64, error) {
	if len(demands) != len(weights) || !(capacity >= 0) || math.IsInf(capacity, 1) {
		return nil, ErrInvalidShares
	}
	totalWeight := 0.0
	order := make([]int, len(demands))
	for i := range demands {
		if !(weights[i] > 0) || math.IsInf(weights[i], 1) || !(demands[i] >= 0) {
			return nil, ErrInvalidShares
		}
		totalWeight += weights[i]
		order[i] = i
	}
	// Flows asking least per unit of weight are satisfied first; once the
	// equal per-weight level of what is left no longer covers a flow's
	// demand, every remaining flow gets that level.
	sort.SliceStable(order, func(a, b int) bool {
		return demands[order[a]]/weights[order[a]] < demands[order[b]]/weights[order[b]]
	})
	alloc := make([]float64, len(demands))
	remaining := capacity
	for k, i := range order {
		levelPerWeight := remaining / totalWeight
		if demands[i] <= levelPerWeight*weights[i] {
			alloc[i] = demands[i]
			remaining -= demands[i]
			totalWeight -= weights[i]
			continue
		}
		for _, j := range order[k:] {
			alloc[j] = levelPerWeight * weights[j]
		}
		break
	}
	return alloc, nil
}
