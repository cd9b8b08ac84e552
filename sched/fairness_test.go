package sched

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// dispatcher is what the fairness harness drives: the Scheduler, or the
// FIFO negative control below.
type dispatcher interface {
	Enqueue(Request) error
	Dispatch() (Request, bool)
	Settle(reservationID string, actualCost int64) error
}

// fifo is the negative control: one first-come first-served queue that
// ignores weights, with the same per-tenant queue bound.
type fifo struct {
	maxQueue  int
	queue     []Request
	perTenant map[string]int
	inflight  map[string]bool
}

func newFIFO(maxQueue int) *fifo {
	return &fifo{maxQueue: maxQueue, perTenant: map[string]int{}, inflight: map[string]bool{}}
}

func (f *fifo) Enqueue(r Request) error {
	if f.perTenant[r.Tenant] >= f.maxQueue {
		return ErrQueueFull
	}
	f.perTenant[r.Tenant]++
	f.queue = append(f.queue, r)
	return nil
}

func (f *fifo) Dispatch() (Request, bool) {
	if len(f.queue) == 0 {
		return Request{}, false
	}
	r := f.queue[0]
	f.queue = f.queue[1:]
	f.perTenant[r.Tenant]--
	f.inflight[r.ReservationID] = true
	return r, true
}

func (f *fifo) Settle(id string, _ int64) error {
	if !f.inflight[id] {
		return ErrUnknownDispatch
	}
	delete(f.inflight, id)
	return nil
}

// flow is one tenant of a scenario.
type flow struct {
	name     string
	weight   int64
	priority int
	backlog  int // > 0: topped up to this many queued requests every tick
	every    int // > 0: one request arrives every `every` ticks
	// The backend really uses estimate * actualNum / actualDen (1/1 if 0).
	actualNum, actualDen int64
}

// scenario is a tick-driven run: flows enqueue, the backend runs up to
// concurrency requests at once, each for ceil(actual/unitsPerTick) ticks,
// and settles it when done.
type scenario struct {
	flows        []flow
	mode         PriorityMode
	levelWeights map[int]int64
	concurrency  int
	ticks        int
	warmup       int // ticks before the measured window starts
	minCost      int64
	maxCost      int64 // estimates are uniform in [minCost, maxCost]
	unitsPerTick int64
	quantum      int64
	maxQueue     int
	seed         uint64
	// noCorrection settles the dispatcher with the estimate instead of the
	// actual cost (the meter still sees the actual): the negative control
	// for settle correction.
	noCorrection bool
}

type outcome struct {
	snapshot []TenantFairness
	// maxRFE is the largest RFE seen, at every tick, over windows starting
	// at the warmup and at staggered later ticks.
	maxRFE float64
	// rfeBound is docs/FAIRNESS.md's bound for this run:
	// 2 * (max(Q, L) + 3*c*E) / w_min.
	rfeBound float64
}

// worst returns the largest per-tenant error of an outcome.
func (o outcome) worst() TenantFairness {
	var w TenantFairness
	for _, tf := range o.snapshot {
		if tf.Error >= w.Error {
			w = tf
		}
	}
	return w
}

func (sc scenario) newScheduler(t testing.TB) *Scheduler {
	s := mustNew(t, Config{Quantum: sc.quantum, MaxQueuePerTenant: sc.maxQueue, PriorityMode: sc.mode})
	for _, f := range sc.flows {
		mustSetTenant(t, s, f.name, f.weight, f.priority)
	}
	for p, w := range sc.levelWeights {
		if err := s.SetLevelWeight(p, w); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (sc scenario) run(t testing.TB, d dispatcher) outcome {
	t.Helper()
	rng := rand.New(rand.NewPCG(sc.seed, 0x5eed))
	const windows = 8
	stride := max((sc.ticks-sc.warmup)/windows, 1)
	meters := make([]*Meter, windows)
	for i := range meters {
		meters[i] = NewMeter()
	}
	type running struct {
		id       string
		tenant   int
		estimate int64
		actual   int64
		done     int
	}
	var inflight []running
	queued := make([]int, len(sc.flows))
	inflightPerTenant := make([]int, len(sc.flows))
	index := make(map[string]int, len(sc.flows))
	for i, f := range sc.flows {
		index[f.name] = i
	}
	var maxInflightPerTenant int
	var maxEstimateError int64
	nextID := 0
	var out outcome

	enqueue := func(tick, i int) {
		f := sc.flows[i]
		cost := sc.minCost + rng.Int64N(sc.maxCost-sc.minCost+1)
		id := fmt.Sprint(nextID)
		if err := d.Enqueue(Request{ReservationID: id, Tenant: f.name, EstimatedCost: cost}); err != nil {
			t.Fatalf("tick %d: enqueue for %s: %v", tick, f.name, err)
		}
		nextID++
		queued[i]++
		for _, m := range meters {
			m.Enqueued(f.name, f.priority, f.weight, cost)
		}
	}

	for tick := range sc.ticks {
		if k := (tick - sc.warmup) / stride; tick >= sc.warmup && (tick-sc.warmup)%stride == 0 && k < windows {
			meters[k].StartWindow()
		}
		// Completions, in dispatch order.
		kept := inflight[:0]
		for _, r := range inflight {
			if r.done > tick {
				kept = append(kept, r)
				continue
			}
			reported := r.actual
			if sc.noCorrection {
				reported = r.estimate
			}
			if err := d.Settle(r.id, reported); err != nil {
				t.Fatalf("tick %d: settle %s: %v", tick, r.id, err)
			}
			inflightPerTenant[r.tenant]--
			for _, m := range meters {
				m.Settled(r.id, r.actual)
			}
		}
		inflight = kept
		// Arrivals.
		for i, f := range sc.flows {
			switch {
			case f.backlog > 0:
				for queued[i] < f.backlog {
					enqueue(tick, i)
				}
			case f.every > 0 && tick%f.every == 0:
				enqueue(tick, i)
			}
		}
		// Dispatch while the backend has room: the scheduler must fill it.
		for len(inflight) < sc.concurrency {
			r, ok := d.Dispatch()
			if !ok {
				break
			}
			i := index[r.Tenant]
			queued[i]--
			f := sc.flows[i]
			num, den := f.actualNum, f.actualDen
			if den == 0 {
				num, den = 1, 1
			}
			actual := r.EstimatedCost * num / den
			maxEstimateError = max(maxEstimateError, abs64(actual-r.EstimatedCost))
			inflightPerTenant[i]++
			maxInflightPerTenant = max(maxInflightPerTenant, inflightPerTenant[i])
			ticks := int((actual + sc.unitsPerTick - 1) / sc.unitsPerTick)
			inflight = append(inflight, running{id: r.ReservationID, tenant: i, estimate: r.EstimatedCost, actual: actual, done: tick + max(ticks, 1)})
			for _, m := range meters {
				m.Dispatched(r.ReservationID, r.Tenant, r.EstimatedCost)
			}
		}
		for k, m := range meters {
			if tick >= sc.warmup+k*stride {
				out.maxRFE = math.Max(out.maxRFE, m.RFE())
			}
		}
	}
	out.snapshot = meters[0].Snapshot()

	minWeight := int64(math.MaxInt64)
	for _, f := range sc.flows {
		minWeight = min(minWeight, f.weight)
	}
	c, e := float64(maxInflightPerTenant), float64(maxEstimateError)
	out.rfeBound = 2 * (math.Max(float64(sc.quantum), float64(sc.maxCost)) + 3*c*e) / float64(minWeight)
	return out
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// checkWithinBudget fails the test for every tenant whose error exceeds the
// default budget, and if the largest RFE exceeds the stated bound.
func checkWithinBudget(t *testing.T, o outcome) {
	t.Helper()
	for _, tf := range o.snapshot {
		if tf.Error > DefaultFairnessBudget {
			t.Errorf("%s (w=%d, prio %d): share %.4f, fair share %.4f, error %.4f > budget %.2f",
				tf.Tenant, tf.Weight, tf.Priority, tf.Share, tf.FairShare, tf.Error, DefaultFairnessBudget)
		}
	}
	if o.maxRFE > o.rfeBound {
		t.Errorf("RFE %.1f exceeds its bound %.1f", o.maxRFE, o.rfeBound)
	}
	t.Logf("worst tenant error %.4f (%s); max RFE %.1f, bound %.1f", o.worst().Error, o.worst().Tenant, o.maxRFE, o.rfeBound)
}

func saturated125() scenario {
	return scenario{
		flows: []flow{
			{name: "w1", weight: 1, backlog: 16},
			{name: "w2", weight: 2, backlog: 16},
			{name: "w5", weight: 5, backlog: 16},
		},
		concurrency:  8,
		ticks:        12000,
		warmup:       500,
		minCost:      50,
		maxCost:      150,
		unitsPerTick: 10,
		maxQueue:     16,
		seed:         1,
	}
}

// Weights 1:2:5 with equal, unending demand: shares 1/8, 2/8, 5/8.
func TestWeightedSharesWithinBudget(t *testing.T) {
	for _, mode := range []PriorityMode{PriorityWeighted, PriorityStrict} {
		for _, quantum := range []int64{0, 300} {
			t.Run(fmt.Sprintf("mode=%d/quantum=%d", mode, quantum), func(t *testing.T) {
				sc := saturated125()
				sc.mode, sc.quantum = mode, quantum
				checkWithinBudget(t, sc.run(t, sc.newScheduler(t)))
			})
		}
	}
}

// The negative control: FIFO ignores weights, so the same test must fail.
func TestFIFOFailsWeightedShares(t *testing.T) {
	sc := saturated125()
	o := sc.run(t, newFIFO(sc.maxQueue))
	worst := o.worst()
	if worst.Error <= DefaultFairnessBudget {
		t.Fatalf("FIFO passed the fairness test (worst error %.4f): the test cannot tell fair from unfair", worst.Error)
	}
	t.Logf("FIFO worst error %.3f (%s share %.3f, fair %.3f)", worst.Error, worst.Tenant, worst.Share, worst.FairShare)
}

// A tenant asking less than its fair share gets all it asks; the others
// share the rest by weight (max-min).
func TestSmallDemandGetsAllItAsks(t *testing.T) {
	sc := saturated125()
	sc.flows = []flow{
		{name: "big1", weight: 1, backlog: 16},
		{name: "big2", weight: 2, backlog: 16},
		// Weight 5 would be 5/8 of the backend; it asks about 3%.
		{name: "small", weight: 5, every: 40},
		{name: "tiny", weight: 1, every: 400},
	}
	o := sc.run(t, sc.newScheduler(t))
	checkWithinBudget(t, o)
	for _, tf := range o.snapshot {
		switch tf.Tenant {
		case "small", "tiny":
			if tf.Served != tf.Demand {
				t.Errorf("%s served %d of its demand %d", tf.Tenant, tf.Served, tf.Demand)
			}
			if tf.Share > 0.1 {
				t.Errorf("%s share %.3f: the scenario should keep it well below its weight", tf.Tenant, tf.Share)
			}
		}
	}
}

// Estimates that are systematically wrong converge once settles correct the
// virtual times; without the correction, the same run is unfair.
func TestWrongEstimatesConvergeAfterSettle(t *testing.T) {
	flowsFor := func(f1, f2, f5 [2]int64) []flow {
		return []flow{
			{name: "w1", weight: 1, backlog: 16, actualNum: f1[0], actualDen: f1[1]},
			{name: "w2", weight: 2, backlog: 16, actualNum: f2[0], actualDen: f2[1]},
			{name: "w5", weight: 5, backlog: 16, actualNum: f5[0], actualDen: f5[1]},
		}
	}
	under, over, exact := [2]int64{3, 10}, [2]int64{3, 1}, [2]int64{1, 1}
	cases := map[string][]flow{
		"w1x3,w2x0.3,w5x1":   flowsFor(over, under, exact),
		"w1x0.3,w2x1,w5x3":   flowsFor(under, exact, over),
		"all x0.3":           flowsFor(under, under, under),
		"all x3":             flowsFor(over, over, over),
		"w1x0.3,w2x3,w5x0.3": flowsFor(under, over, under),
	}
	for name, flows := range cases {
		t.Run(name, func(t *testing.T) {
			sc := saturated125()
			sc.flows = flows
			sc.ticks = 20000
			checkWithinBudget(t, sc.run(t, sc.newScheduler(t)))
		})
	}
	t.Run("negative control: no correction", func(t *testing.T) {
		sc := saturated125()
		sc.flows = cases["w1x3,w2x0.3,w5x1"]
		sc.ticks = 20000
		sc.noCorrection = true
		o := sc.run(t, sc.newScheduler(t))
		if w := o.worst(); w.Error <= DefaultFairnessBudget {
			t.Fatalf("uncorrected estimates stayed within budget (worst %.4f): the test proves nothing", w.Error)
		}
		t.Logf("without correction: worst error %.3f (%s share %.3f, fair %.3f)", o.worst().Error, o.worst().Tenant, o.worst().Share, o.worst().FairShare)
	})
}

// Two weighted levels: fair within each level, and the levels share the
// backend 3:1 by level weight.
func TestWeightedLevelsFairWithinAndAcross(t *testing.T) {
	sc := saturated125()
	sc.flows = []flow{
		{name: "gold-a", weight: 1, priority: 1, backlog: 16},
		{name: "gold-b", weight: 3, priority: 1, backlog: 16},
		{name: "bronze-a", weight: 1, priority: 0, backlog: 16},
		{name: "bronze-b", weight: 1, priority: 0, backlog: 16, actualNum: 3, actualDen: 10},
		{name: "bronze-c", weight: 2, priority: 0, backlog: 16},
	}
	sc.levelWeights = map[int]int64{1: 3, 0: 1}
	sc.ticks = 20000
	o := sc.run(t, sc.newScheduler(t))
	checkWithinBudget(t, o)
	perLevel := map[int]float64{}
	total := 0.0
	for _, tf := range o.snapshot {
		perLevel[tf.Priority] += float64(tf.Served)
		total += float64(tf.Served)
	}
	if gold := perLevel[1] / total; math.Abs(gold-0.75)/0.75 > DefaultFairnessBudget {
		t.Errorf("gold level got %.3f of the backend, want 0.75 within budget", gold)
	}
}

// waitBound is docs/FAIRNESS.md's bounded wait, for exact estimates within
// one level: the estimated cost dispatched after a request is enqueued at
// position p of its tenant's queue and before it is dispatched is at most
// p*Lmax*W/w_i + (N-1)*max(Q, Lmax).
func waitBound(p int, maxCost, quantum, weight, totalWeight int64, tenants int) int64 {
	return int64(p)*maxCost*totalWeight/weight + int64(tenants-1)*max(quantum, maxCost)
}

// A flood from one tenant cannot starve the others: every request waits
// no more than the bound, and the flood's own requests too.
func TestBoundedWaitUnderFlood(t *testing.T) {
	for _, quantum := range []int64{0, 400} {
		t.Run(fmt.Sprintf("quantum=%d", quantum), func(t *testing.T) {
			const (
				maxQueue = 32
				minCost  = 10
				maxCost  = 200
				steps    = 60000
			)
			s := mustNew(t, Config{Quantum: quantum, MaxQueuePerTenant: maxQueue})
			weights := map[string]int64{"flood": 1, "s1": 1, "s2": 2, "s3": 3, "s4": 1}
			names := []string{"flood", "s1", "s2", "s3", "s4"}
			totalWeight := int64(0)
			for _, n := range names {
				mustSetTenant(t, s, n, weights[n], 0)
				totalWeight += weights[n]
			}
			rng := rand.New(rand.NewPCG(7, uint64(quantum)))
			type waiting struct {
				position   int
				enqueuedAt int64 // cumulative dispatched cost at enqueue
			}
			pending := map[string]waiting{}
			var dispatchedCost int64
			nextID := 0
			enqueue := func(tenant string) bool {
				id := fmt.Sprint(nextID)
				err := s.Enqueue(Request{ReservationID: id, Tenant: tenant, EstimatedCost: minCost + rng.Int64N(maxCost-minCost+1)})
				if err == ErrQueueFull {
					return false
				}
				if err != nil {
					t.Fatal(err)
				}
				nextID++
				pending[id] = waiting{position: s.QueueLen(tenant), enqueuedAt: dispatchedCost}
				return true
			}
			worstRatio := 0.0
			for range steps {
				for enqueue("flood") { // the flood keeps its queue full
				}
				if tenant := names[1+rng.IntN(len(names)-1)]; rng.IntN(50) == 0 {
					for range 1 + rng.IntN(maxQueue) { // a burst, up to a full queue
						if !enqueue(tenant) {
							break
						}
					}
				}
				r := mustDispatch(t, s)
				w := pending[r.ReservationID]
				delete(pending, r.ReservationID)
				waited := dispatchedCost - w.enqueuedAt
				bound := waitBound(w.position, maxCost, quantum, weights[r.Tenant], totalWeight, len(names))
				if waited > bound {
					t.Fatalf("%s request at queue position %d waited %d cost units, bound %d", r.Tenant, w.position, waited, bound)
				}
				worstRatio = math.Max(worstRatio, float64(waited)/float64(bound))
				dispatchedCost += r.EstimatedCost
				if err := s.Settle(r.ReservationID, r.EstimatedCost); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("worst wait reached %.0f%% of its bound", 100*worstRatio)
		})
	}
}

// Many tenants, short queues: 256 tenants, 64 of each weight 1 to 4, each
// with two requests queued (topped up every tick), as the
// simulator's 256-tenant runs give an executor. Over the run every tenant
// is backlogged, so its fair share is w_i/Σw of the service; each weight
// class's service must be within the default budget of its classes' fair
// share, and each tenant within the proven bound of docs/FAIRNESS.md,
// |S_i - F_i| <= (M + 3·c·E)·(1 + w_i/w_min) (exact estimates: E = 0).
func TestManyTenantsShortQueuesShareByWeight(t *testing.T) {
	sc := saturated125()
	sc.flows = nil
	for i := range 256 {
		sc.flows = append(sc.flows, flow{name: fmt.Sprintf("t%03d", i), weight: int64(1 + i%4), backlog: 2})
	}
	sc.ticks, sc.warmup = 60000, 2000
	sc.maxQueue = 4
	o := sc.run(t, sc.newScheduler(t))
	var served, fair [5]float64
	var capacity float64
	for _, tf := range o.snapshot {
		capacity += float64(tf.Served)
	}
	bound := float64(sc.maxCost) // M = L with Q = 0, E = 0
	for _, tf := range o.snapshot {
		if !tf.Backlogged {
			t.Fatalf("%s was not backlogged through the window: the scenario is not saturated", tf.Tenant)
		}
		f := tf.FairShare * capacity
		served[tf.Weight] += float64(tf.Served)
		fair[tf.Weight] += f
		if d, b := math.Abs(float64(tf.Served)-f), bound*(1+float64(tf.Weight)); d > b {
			t.Errorf("%s (w=%d) served %d against a fair %.0f: off by %.0f > bound %.0f", tf.Tenant, tf.Weight, tf.Served, f, d, b)
		}
	}
	for w := 1; w <= 4; w++ {
		e := math.Abs(served[w]-fair[w]) / fair[w]
		t.Logf("weight %d: served %.0f, fair %.0f, error %.4f", w, served[w], fair[w], e)
		if e > DefaultFairnessBudget {
			t.Errorf("tenants of weight %d served %.0f against a fair %.0f: error %.4f > budget %.2f", w, served[w], fair[w], e, DefaultFairnessBudget)
		}
	}
}
