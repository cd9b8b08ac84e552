package sched

import (
	"fmt"
	"testing"
)

// benchQueue is what the benchmark loop needs; *Scheduler and *Locked both
// have it.
type benchQueue interface {
	Enqueue(Request) error
	Dispatch() (Request, bool)
	Settle(reservationID string, actualCost int64) error
}

// benchSteadyState measures one request's whole passage in steady state:
// Dispatch, Settle (of the request dispatched `window` requests earlier, so
// the backend always has that many in flight) and Enqueue of a replacement
// for the settled request's tenant, reusing its reservation id so the
// harness itself allocates nothing. Every tenant keeps about 4 requests
// queued; weights run 1..8, estimates 50..249, actual costs 30%..300% of
// the estimate, so settles move virtual times both ways.
func benchSteadyState(b *testing.B, q benchQueue, setTenant func(string, int64, int) error, tenants, levels int) {
	const perTenant, window = 4, 64
	names := make([]string, tenants)
	for i := range names {
		names[i] = fmt.Sprint("tenant-", i)
		if err := setTenant(names[i], int64(1+i%8), i%levels); err != nil {
			b.Fatal(err)
		}
	}
	estimate := func(tenant, k int) int64 { return int64(50 + (tenant*31+k*17)%200) }
	actual := func(est int64, k int) int64 { return est * int64(3+k%28) / 10 }
	// The payload points at the tenant's index, so the loop finds the
	// tenant of a settled request without a map lookup of its own.
	index := make([]int, tenants)
	for i := range tenants {
		index[i] = i
		for k := range perTenant {
			id := fmt.Sprintf("rsv-%d-%d", i, k)
			if err := q.Enqueue(Request{ReservationID: id, Tenant: names[i], EstimatedCost: estimate(i, k), Payload: &index[i]}); err != nil {
				b.Fatal(err)
			}
		}
	}
	var inflight [window]Request
	step := 0
	once := func() {
		r, ok := q.Dispatch()
		if !ok {
			b.Fatal("Dispatch returned nothing in steady state")
		}
		old := inflight[step%window]
		inflight[step%window] = r
		step++
		if old.ReservationID == "" {
			return
		}
		if err := q.Settle(old.ReservationID, actual(old.EstimatedCost, step)); err != nil {
			b.Fatal(err)
		}
		i := *old.Payload.(*int)
		if err := q.Enqueue(Request{ReservationID: old.ReservationID, Tenant: names[i], EstimatedCost: estimate(i, step), Payload: old.Payload}); err != nil {
			b.Fatal(err)
		}
	}
	// Warm up: every ring and map reaches its steady size before timing.
	for range 3 * tenants * perTenant {
		once()
	}
	b.ReportAllocs()
	for b.Loop() {
		once()
	}
}

func BenchmarkDispatchSettle(b *testing.B) {
	for _, tc := range []struct {
		name    string
		tenants int
		levels  int
		mode    PriorityMode
	}{
		{"tenants=10000", 10000, 1, PriorityWeighted},
		{"tenants=10000/levels=4/weighted", 10000, 4, PriorityWeighted},
		{"tenants=10000/levels=4/strict", 10000, 4, PriorityStrict},
		{"tenants=100", 100, 1, PriorityWeighted},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := mustNew(b, Config{MaxQueuePerTenant: 8, PriorityMode: tc.mode})
			benchSteadyState(b, s, s.SetTenant, tc.tenants, tc.levels)
		})
	}
	b.Run("tenants=10000/locked", func(b *testing.B) {
		l, err := NewLocked(Config{MaxQueuePerTenant: 8})
		if err != nil {
			b.Fatal(err)
		}
		benchSteadyState(b, l, l.SetTenant, 10000, 1)
	})
	b.Run("tenants=10000/meter", func(b *testing.B) {
		s := mustNew(b, Config{MaxQueuePerTenant: 8, Meter: NewMeter()})
		benchSteadyState(b, s, s.SetTenant, 10000, 1)
	})
}
