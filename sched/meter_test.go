package sched

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"testing"

	"pgregory.net/rapid"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestWeightedMaxMinShares(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name     string
		capacity float64
		demands  []float64
		weights  []float64
		want     []float64
	}{
		{"textbook equal weights", 10, []float64{2, 2.6, 4, 5}, []float64{1, 1, 1, 1}, []float64{2, 2.6, 2.7, 2.7}},
		{"everyone satisfied", 10, []float64{1, 2, 3}, []float64{1, 5, 1}, []float64{1, 2, 3}},
		{"weights 1:2:5 unlimited", 80, []float64{inf, inf, inf}, []float64{1, 2, 5}, []float64{10, 20, 50}},
		{"small demand gets all it asks", 80, []float64{inf, inf, 3}, []float64{1, 2, 5}, []float64{77.0 / 3, 2 * 77.0 / 3, 3}},
		{"weighted leftover", 12, []float64{1, inf, inf}, []float64{4, 1, 2}, []float64{1, 11.0 / 3, 22.0 / 3}},
		{"zero capacity", 0, []float64{5, inf}, []float64{1, 1}, []float64{0, 0}},
		{"empty", 5, nil, nil, []float64{}},
	}
	for _, tc := range tests {
		got, err := WeightedMaxMinShares(tc.capacity, tc.demands, tc.weights)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
			continue
		}
		for i := range got {
			if !near(got[i], tc.want[i]) {
				t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
	for _, bad := range []struct {
		capacity         float64
		demands, weights []float64
	}{
		{10, []float64{1}, []float64{1, 2}},
		{10, []float64{1}, []float64{0}},
		{10, []float64{1}, []float64{-1}},
		{10, []float64{1}, []float64{math.Inf(1)}},
		{10, []float64{-1}, []float64{1}},
		{10, []float64{math.NaN()}, []float64{1}},
		{-1, []float64{1}, []float64{1}},
		{math.NaN(), []float64{1}, []float64{1}},
		{math.Inf(1), []float64{1}, []float64{1}},
	} {
		if got, err := WeightedMaxMinShares(bad.capacity, bad.demands, bad.weights); err != ErrInvalidShares || got != nil {
			t.Errorf("WeightedMaxMinShares(%v, %v, %v) = %v, %v; want nil, ErrInvalidShares", bad.capacity, bad.demands, bad.weights, got, err)
		}
	}
}

// A hand-checked window: two backlogged tenants and one small one.
func TestMeterSnapshotAndRFE(t *testing.T) {
	m := NewMeter()
	// Before the window: a queued, b queued, c nothing. One request of a
	// in flight across the window start.
	m.Enqueued("a", 0, 1, 10)
	m.Dispatched("a-old", "a", 10)
	for range 5 {
		m.Enqueued("a", 0, 1, 10)
		m.Enqueued("b", 0, 3, 10)
	}
	m.StartWindow()
	m.Settled("a-old", 99) // dispatched before the window: not counted
	m.Dispatched("a1", "a", 10)
	m.Dispatched("b1", "b", 10)
	m.Dispatched("b2", "b", 10)
	m.Settled("a1", 7)
	m.Settled("b1", 12)
	// b2 unsettled: counts at its estimate 10.
	m.Enqueued("c", 0, 2, 4)
	m.Dispatched("c1", "c", 4)
	m.Settled("c1", 4)
	m.Settled("unknown", 5) // ignored

	// Service: a 7, b 22, c 4; capacity 33. a, b backlogged (unlimited
	// demand), c demanded 4 and is not backlogged.
	// Max-min: c gets 4, a and b share 29 as 1:3 -> 7.25, 21.75.
	snap := m.Snapshot()
	want := []TenantFairness{
		{Tenant: "a", Weight: 1, Served: 7, Demand: 7 + 40, Backlogged: true, Share: 7.0 / 33, FairShare: 7.25 / 33, Error: 0.25 / 7.25},
		{Tenant: "b", Weight: 3, Served: 22, Demand: 22 + 30, Backlogged: true, Share: 22.0 / 33, FairShare: 21.75 / 33, Error: 0.25 / 21.75},
		{Tenant: "c", Weight: 2, Served: 4, Demand: 4, Share: 4.0 / 33, FairShare: 4.0 / 33},
	}
	if len(snap) != len(want) {
		t.Fatalf("snapshot %+v, want %+v", snap, want)
	}
	for i, w := range want {
		g := snap[i]
		if g.Tenant != w.Tenant || g.Weight != w.Weight || g.Served != w.Served || g.Demand != w.Demand ||
			g.Backlogged != w.Backlogged || !near(g.Share, w.Share) || !near(g.FairShare, w.FairShare) || !near(g.Error, w.Error) {
			t.Errorf("snapshot[%d] = %+v, want %+v", i, g, w)
		}
	}
	// RFE over backlogged a, b: |7/1 - 22/3|.
	if got := m.RFE(); !near(got, 22.0/3-7) {
		t.Errorf("RFE = %v, want %v", got, 22.0/3-7)
	}
	// a's queue empties: it stops counting as backlogged for this window.
	for i := range 4 {
		m.Dispatched(fmt.Sprint("a-more-", i), "a", 10)
	}
	if got := m.RFE(); got != 0 {
		t.Errorf("RFE with one backlogged tenant left = %v, want 0", got)
	}
	m.StartWindow()
	for _, tf := range m.Snapshot() {
		if tf.Served != 0 {
			t.Errorf("new window: %s served %d, want 0", tf.Tenant, tf.Served)
		}
		if tf.Tenant == "b" && !tf.Backlogged {
			t.Errorf("new window: b has requests queued but is not backlogged")
		}
	}
}

// Levels are measured separately: a starved strict lower level shows no
// within-level error, and tenants are ordered by priority, then name.
func TestMeterLevelsAreSeparate(t *testing.T) {
	m := NewMeter()
	m.Enqueued("low", 0, 1, 10)
	m.Enqueued("hi-b", 5, 1, 10)
	m.Enqueued("hi-a", 5, 1, 10)
	m.Dispatched("1", "hi-a", 10)
	m.Dispatched("2", "hi-b", 10)
	snap := m.Snapshot()
	var names []string
	for _, tf := range snap {
		names = append(names, tf.Tenant)
		if tf.Error != 0 {
			t.Errorf("%s error %v, want 0", tf.Tenant, tf.Error)
		}
	}
	if fmt.Sprint(names) != "[hi-a hi-b low]" {
		t.Errorf("snapshot order %v, want [hi-a hi-b low]", names)
	}
}

// Config.Meter sees the same events a caller would report by hand.
func TestSchedulerFeedsMeter(t *testing.T) {
	auto := NewMeter()
	manual := NewMeter()
	s := mustNew(t, Config{Meter: auto, MaxQueuePerTenant: 100})
	mustSetTenant(t, s, "a", 1, 0)
	mustSetTenant(t, s, "b", 4, 2)
	for i := range 60 {
		tenant, prio, weight := "a", 0, int64(1)
		if i%3 == 0 {
			tenant, prio, weight = "b", 2, 4
		}
		id := fmt.Sprint(i)
		mustEnqueue(t, s, id, tenant, int64(5+i%7))
		manual.Enqueued(tenant, prio, weight, int64(5+i%7))
		if i == 20 {
			auto.StartWindow()
			manual.StartWindow()
		}
		if i%2 == 1 {
			r := mustDispatch(t, s)
			manual.Dispatched(r.ReservationID, r.Tenant, r.EstimatedCost)
			if err := s.Settle(r.ReservationID, r.EstimatedCost/2); err != nil {
				t.Fatal(err)
			}
			manual.Settled(r.ReservationID, r.EstimatedCost/2)
		}
	}
	if a, b := fmt.Sprint(auto.Snapshot()), fmt.Sprint(manual.Snapshot()); a != b {
		t.Errorf("scheduler-fed meter\n%s\ndiffers from hand-fed meter\n%s", a, b)
	}
	if auto.RFE() != manual.RFE() {
		t.Errorf("RFE %v vs %v", auto.RFE(), manual.RFE())
	}
}

func TestMeterConcurrentSnapshot(t *testing.T) {
	m := NewMeter()
	l, err := NewLocked(Config{Meter: m, MaxQueuePerTenant: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetTenant("a", 1, 0); err != nil {
		t.Fatal(err)
	}
	// Run under -race: snapshots taken while the scheduler feeds the meter
	// must not race, and each must be a consistent cut (at most one request
	// of 3 in flight on top of the settled 2s).
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 200 {
			for _, line := range m.Snapshot() {
				if line.Tenant != "a" || line.Served > 500*2+1 || line.Demand < line.Served {
					t.Errorf("concurrent snapshot line %+v", line)
				}
			}
			if rfe := m.RFE(); rfe != 0 {
				t.Errorf("RFE %v with one tenant, want 0", rfe)
			}
		}
	}()
	for i := range 500 {
		if err := l.Enqueue(Request{ReservationID: fmt.Sprint(i), Tenant: "a", EstimatedCost: 3}); err != nil {
			t.Fatal(err)
		}
		r, _ := l.Dispatch()
		if err := l.Settle(r.ReservationID, 2); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	got := m.Snapshot()
	if len(got) != 1 || got[0].Served != 500*2 || got[0].Demand != 500*2 || got[0].Share != 1 {
		t.Errorf("final snapshot %+v, want tenant a served and demanded 1000 (500 settles of 2), share 1", got)
	}
}

// Dropping idle tenants at StartWindow changes no metric: the same events,
// windows and settles of long-finished dispatches given to a Meter that
// drops and to one that keeps every tenant give the same RFE and Snapshot
// at every step, and the dropping one holds only recent tenants.
func TestMeterDropsIdleTenantsWithoutChangingMetrics(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		drops, keeps := NewMeter(), NewMeter()
		keeps.keepIdle = true
		both := []*Meter{drops, keeps}
		nTenants := rapid.IntRange(1, 10).Draw(t, "tenants")
		queued := make([][]int64, nTenants)
		var inflight []string
		nextID := 0
		t.Repeat(map[string]func(*rapid.T){
			"": func(t *rapid.T) {
				if d, k := drops.RFE(), keeps.RFE(); d != k {
					t.Fatalf("RFE %v dropping, %v keeping", d, k)
				}
				if d, k := drops.Snapshot(), keeps.Snapshot(); !reflect.DeepEqual(d, k) {
					t.Fatalf("Snapshot\n%+v dropping\n%+v keeping", d, k)
				}
			},
			"enqueue": func(t *rapid.T) {
				i := rapid.IntRange(0, nTenants-1).Draw(t, "tenant")
				cost := rapid.Int64Range(1, 100).Draw(t, "cost")
				queued[i] = append(queued[i], cost)
				for _, m := range both {
					m.Enqueued(tenantName(i), i%2, int64(1+i%3), cost)
				}
			},
			"dispatch": func(t *rapid.T) {
				i := rapid.IntRange(0, nTenants-1).Draw(t, "tenant")
				if len(queued[i]) == 0 {
					t.Skip("nothing queued")
				}
				id := strconv.Itoa(nextID)
				nextID++
				for _, m := range both {
					m.Dispatched(id, tenantName(i), queued[i][0])
				}
				queued[i] = queued[i][1:]
				inflight = append(inflight, id)
			},
			"settle": func(t *rapid.T) {
				if len(inflight) == 0 {
					t.Skip("nothing in flight")
				}
				k := rapid.IntRange(0, len(inflight)-1).Draw(t, "which")
				actual := rapid.Int64Range(0, 200).Draw(t, "actual")
				for _, m := range both {
					m.Settled(inflight[k], actual)
				}
				inflight = append(inflight[:k], inflight[k+1:]...)
			},
			"window": func(t *rapid.T) {
				for _, m := range both {
					m.StartWindow()
				}
			},
		})
	})

	// The windows a tenant is kept for, by hand.
	m := NewMeter()
	m.Enqueued("gone", 0, 1, 5)
	m.Dispatched("g", "gone", 5)
	m.Settled("g", 5)
	m.Enqueued("waiting", 0, 1, 5) // never dispatched: stays
	m.Enqueued("late", 0, 1, 5)
	m.Dispatched("l", "late", 5) // settled two windows later
	held := func() []string {
		var names []string
		for name := range m.tenants {
			names = append(names, name)
		}
		sort.Strings(names)
		return names
	}
	m.StartWindow() // window 1: all had events in window 0
	m.StartWindow() // window 2: window 0 is the one before the ending window 1
	if got := fmt.Sprint(held()); got != "[gone late waiting]" {
		t.Fatalf("at window 2 the meter holds %s, want [gone late waiting]", got)
	}
	m.StartWindow() // window 3: no event in windows 1 and 2
	if got := fmt.Sprint(held()); got != "[waiting]" {
		t.Fatalf("at window 3 the meter holds %s, want [waiting]", got)
	}
	m.Settled("l", 50) // dispatched in window 0: ignored
	if snap := m.Snapshot(); len(snap) != 1 || snap[0].Tenant != "waiting" || snap[0].Served != 0 {
		t.Fatalf("snapshot after a late settle %+v, want waiting alone with nothing served", snap)
	}
}
