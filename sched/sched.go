package sched

import (
	"errors"
	"slices"
	"sort"
)

// Expected outcomes, returned as values (never wrapped, so a rejection costs
// no allocation on the hot path; compare with errors.Is or ==).
var (
	// ErrNoReservation: the request carries no reservation id. sched only
	// orders work the ledger already reserved; it never admits anything.
	ErrNoReservation = errors.New("sched: request has no reservation id")
	// ErrInvalidCost: an estimated cost outside [1, MaxCost] or an actual
	// cost outside [0, MaxCost].
	ErrInvalidCost = errors.New("sched: cost out of range")
	// ErrQueueFull: the tenant already has Config.MaxQueuePerTenant requests
	// waiting. The caller should release the reservation or retry later.
	ErrQueueFull = errors.New("sched: tenant queue is full")
	// ErrUnknownTenant: Enqueue for a tenant that SetTenant never declared
	// or, with Config.ForgetDeclarations, whose declaration was forgotten
	// with its state.
	ErrUnknownTenant = errors.New("sched: tenant has no weight and priority set")
	// ErrDuplicateReservation: the reservation id is already queued or
	// dispatched and not yet settled.
	ErrDuplicateReservation = errors.New("sched: reservation is already queued or dispatched")
	// ErrUnknownDispatch: Settle for a reservation id that is not dispatched:
	// never enqueued, still queued, or already settled.
	ErrUnknownDispatch = errors.New("sched: reservation is not dispatched or already settled")
	// ErrInvalidWeight: a weight outside [1, MaxWeight].
	ErrInvalidWeight = errors.New("sched: weight out of range")
	// ErrInvalidConfig: a negative Quantum or MaxQueuePerTenant, a Quantum
	// above MaxCost, or an unknown PriorityMode.
	ErrInvalidConfig = errors.New("sched: invalid config")
)

const (
	// VirtualScale multiplies costs before they are divided by a weight, so
	// virtual times stay integers with a rounding error below 1/VirtualScale
	// cost unit per request.
	VirtualScale = 1 << 20
	// MaxWeight is the largest tenant or level weight; with VirtualScale it
	// keeps every charge of a positive cost at one virtual unit or more.
	MaxWeight = 1 << 20
	// MaxCost is the largest estimated or actual cost of one request. It keeps
	// cost*VirtualScale far from int64 overflow.
	MaxCost = 1 << 32
	// DefaultMaxQueuePerTenant applies when Config.MaxQueuePerTenant is 0.
	DefaultMaxQueuePerTenant = 64
	// DefaultFairnessBudget is the per-tenant fairness error budget (e_i in
	// docs/FAIRNESS.md) a policy gets when it does not set its own.
	DefaultFairnessBudget = 0.05

	// sweepPerCall is how many held idle tenants each Enqueue, Dispatch
	// and Settle examines for forgetting (see sweep).
	sweepPerCall = 2

	// defaultRebaseAt: when a virtual clock passes it, every virtual time on
	// that clock is shifted down so int64 never overflows (see rebaseLevel).
	defaultRebaseAt = 1 << 60
)

// PriorityMode says how priority levels share dispatches.
type PriorityMode int

const (
	// PriorityWeighted (the default) shares dispatches between backlogged
	// levels in proportion to their level weights (SetLevelWeight), by the
	// same fair-queuing rule used between tenants. Every queued request has a
	// bounded wait, whatever the other levels do.
	PriorityWeighted PriorityMode = iota
	// PriorityStrict always dispatches from the highest non-empty level. A
	// lower level waits as long as any higher level has work queued.
	PriorityStrict
)

// Request is one already-reserved unit of work.
type Request struct {
	// ReservationID is the ledger's reservation id; it identifies the
	// request from Enqueue to Settle and must not be empty.
	ReservationID string
	// Tenant selects the fair-queuing flow; its weight and priority come
	// from SetTenant.
	Tenant string
	// EstimatedCost is the reserved cost, in [1, MaxCost] ledger units.
	EstimatedCost int64
	// Payload is carried through untouched.
	Payload any
}

// Config parameterizes a Scheduler. The zero value is usable.
type Config struct {
	// Quantum is the most credit, in cost units, an idle tenant (or level)
	// can bring back when it becomes backlogged again. 0: none, it restarts
	// exactly at the current virtual time.
	Quantum int64
	// MaxQueuePerTenant bounds each tenant's waiting requests; Enqueue
	// beyond it returns ErrQueueFull. 0 means DefaultMaxQueuePerTenant.
	MaxQueuePerTenant int
	// PriorityMode chooses weighted (default) or strict priority levels.
	PriorityMode PriorityMode
	// Meter, if not nil, receives every enqueue, dispatch and settle.
	Meter *Meter
	// ForgetDeclarations makes SetTenant's declaration (weight and
	// priority) live only as long as the tenant's state: once the
	// scheduler forgets an idle tenant (see Scheduler), Enqueue returns
	// ErrUnknownTenant for it until SetTenant declares it again. It is for
	// a caller that calls SetTenant right before every Enqueue, as
	// client.FairQueue does under its lock: the scheduler then holds
	// nothing for a tenant it forgot. (Through Locked, another goroutine's
	// call between the two may forget the declaration.) False (the
	// default): declarations are kept, about 100 bytes each with a short
	// name (docs/FAIRNESS.md).
	ForgetDeclarations bool
}

// Scheduler is a work-conserving weighted fair queue of reserved requests.
// Use New; the zero value is not usable. Not safe for concurrent use (see
// Locked).
//
// The Scheduler holds a tenant's state (its queue and virtual time) only
// while it says something a fresh tenant's would not: while the tenant has
// requests queued or dispatched and unsettled, and afterwards until its
// level's clock V has passed its virtual time by the most idle credit any
// weight can bring back (v <= V - Quantum*VirtualScale). Past that point the
// tenant, coming back, would start at V minus its credit whether it was kept
// or not, so the Scheduler forgets it and the dispatch order is the same as
// if it had kept everything. That holds across policy changes too, because
// an idle tenant with its whole credit is treated as a new one wherever its
// credit is decided (newTenantVtime). A tenant idle but ahead (it was charged more
// than its share, e.g. by settles above the estimate) is kept until the
// clock passes it, so leaving and coming back gains it nothing. Forgetting
// is lazy: each call examines at most sweepPerCall idle tenants, so memory
// follows the tenants in use, not every tenant ever seen.
type Scheduler struct {
	quantum  int64
	maxQueue int
	mode     PriorityMode
	meter    *Meter
	rebaseAt int64

	// tenants holds the tenants the Scheduler has not forgotten; declared
	// holds the weight and level SetTenant last gave each tenant, held or
	// not (nil with forgetDeclarations: a held tenant carries its own).
	tenants            map[string]*tenant
	declared           map[string]declaration
	forgetDeclarations bool
	// idle holds every held tenant with nothing queued or in flight (and
	// maybe some that became busy again since), oldest first; sweep walks
	// it. tenantsPeak is the largest len(tenants) since the map was last
	// rebuilt (Go maps do not give memory back when entries are deleted).
	idle        ring[*tenant]
	tenantsPeak int
	// keepIdle disables forgetting; tests compare the dispatch order with
	// and without it.
	keepIdle bool

	levels []*level // by priority, highest first
	// ids holds every queued or dispatched-but-unsettled reservation, to
	// refuse duplicates and to find a dispatch again at Settle (idsPeak:
	// for compactMap). Records are recycled through free, so steady state
	// allocates nothing.
	ids     map[string]*reservation
	idsPeak int
	free    []*reservation

	queued   int
	inflight int
	seq      uint64 // enqueue counter, breaks ties between equal finish times
	topClock int64  // weighted mode: virtual clock of the level layer
}

type tenant struct {
	name      string
	weight    int64
	level     *level
	vtime     int64 // virtual finish time of the tenant's last dispatch, corrected by settles
	queue     ring[slot]
	heapIndex int  // position in level.heap, -1 when the queue is empty
	inflight  int  // dispatched and not settled
	onIdle    bool // in Scheduler.idle
}

// declaration is what SetTenant said of a tenant.
type declaration struct {
	weight int64
	level  *level
}

type level struct {
	priority int
	weight   int64
	clock    int64 // V: largest finish time dispatched in this level
	vtime    int64 // weighted mode: this level's virtual time on topClock
	queued   int
	heap     tenantHeap
}

// reservation is the record of one queued or dispatched request. The queue
// slot points at it, so Dispatch updates it without a map lookup.
type reservation struct {
	t          *tenant
	lv         *level // level at dispatch
	dispatched bool
	// What Dispatch charged, and the weights it charged at: Settle replaces
	// the charge by the actual cost's at the same weights.
	tenantCharge int64
	levelCharge  int64
	tenantWeight int64
	levelWeight  int64
}

// New returns an empty Scheduler, or ErrInvalidConfig if cfg has a negative
// Quantum or MaxQueuePerTenant, a Quantum above MaxCost, or an unknown
// PriorityMode.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Quantum < 0 || cfg.Quantum > MaxCost || cfg.MaxQueuePerTenant < 0 ||
		(cfg.PriorityMode != PriorityWeighted && cfg.PriorityMode != PriorityStrict) {
		return nil, ErrInvalidConfig
	}
	maxQueue := cfg.MaxQueuePerTenant
	if maxQueue == 0 {
		maxQueue = DefaultMaxQueuePerTenant
	}
	s := &Scheduler{
		quantum:            cfg.Quantum,
		maxQueue:           maxQueue,
		mode:               cfg.PriorityMode,
		meter:              cfg.Meter,
		rebaseAt:           defaultRebaseAt,
		tenants:            make(map[string]*tenant),
		forgetDeclarations: cfg.ForgetDeclarations,
		ids:                make(map[string]*reservation),
	}
	if !s.forgetDeclarations {
		s.declared = make(map[string]declaration)
	}
	return s, nil
}

// SetTenant declares a tenant or changes its weight and priority, as the
// policy says. It returns ErrInvalidWeight if weight is outside
// [1, MaxWeight], nil otherwise.
//
// A new weight applies to requests dispatched from now on (settles of
// earlier dispatches undo what was charged then); a tenant with nothing
// queued or in flight that has its whole credit (one quantum: it is as far
// behind the clock as a new tenant) gets a new tenant's credit at the new
// weight, exactly what it would get had the scheduler forgotten it. A new
// priority moves the tenant to that level: with requests queued it starts
// at the level's current virtual time with no credit, with none queued it
// starts as a new tenant of that level.
//
// The declaration is kept until SetTenant changes it, unless
// Config.ForgetDeclarations is set: then it lasts as long as the tenant's
// state, which for a tenant with nothing queued or in flight may end at the
// next Enqueue, Dispatch or Settle; call SetTenant right before Enqueue.
func (s *Scheduler) SetTenant(name string, weight int64, priority int) error {
	if weight < 1 || weight > MaxWeight {
		return ErrInvalidWeight
	}
	lv := s.levelFor(priority)
	if !s.forgetDeclarations {
		s.declared[name] = declaration{weight: weight, level: lv}
	}
	t := s.tenants[name]
	if t == nil {
		if s.forgetDeclarations {
			// The state carries the declaration; it is idle until Enqueue.
			s.markIdle(s.hold(name, weight, lv))
		}
		return nil
	}
	if t.level != lv {
		old := t.level
		t.level, t.weight = lv, weight
		if t.heapIndex < 0 {
			t.vtime = s.newTenantVtime(lv, weight)
			return nil
		}
		old.heap.remove(t.heapIndex)
		old.queued -= t.queue.n
		t.vtime = lv.clock
		lv.queued += t.queue.n
		if lv.queued == t.queue.n {
			s.activateLevel(lv)
		}
		head := t.queue.front()
		lv.heap.push(heapEntry{key: t.vtime + charge(head.req.EstimatedCost, weight), seq: head.seq, t: t})
		return nil
	}
	if t.weight != weight {
		if t.queue.n == 0 && t.inflight == 0 && t.vtime <= s.newTenantVtime(lv, t.weight) {
			// Idle with its whole credit, it is to the scheduler a new
			// tenant (one it may have forgotten, see Scheduler): it gets a
			// new tenant's credit at the new weight. Keeping its virtual
			// time would leave it the credit of the old weight (less than a
			// quantum when the weight goes down), which a forgotten tenant
			// declared anew would not have.
			t.vtime = s.newTenantVtime(lv, weight)
		}
		t.weight = weight
		if t.heapIndex >= 0 {
			head := t.queue.front()
			lv.heap[t.heapIndex].key = t.vtime + charge(head.req.EstimatedCost, weight)
			lv.heap.fix(t.heapIndex)
		}
	}
	return nil
}

// SetLevelWeight sets the share of a priority level in PriorityWeighted mode
// (levels never set have weight 1; the value is ignored in PriorityStrict
// mode). It returns ErrInvalidWeight if weight is outside [1, MaxWeight],
// nil otherwise. The new weight applies to dispatches from now on.
func (s *Scheduler) SetLevelWeight(priority int, weight int64) error {
	if weight < 1 || weight > MaxWeight {
		return ErrInvalidWeight
	}
	s.levelFor(priority).weight = weight
	return nil
}

// Enqueue queues a reserved request behind its tenant's earlier ones.
// It returns nil when queued, or, checked in this order:
// ErrNoReservation for an empty ReservationID, ErrInvalidCost for an
// EstimatedCost outside [1, MaxCost], ErrUnknownTenant if SetTenant never
// declared the tenant, ErrDuplicateReservation if the id is already queued
// or dispatched, ErrQueueFull if the tenant has MaxQueuePerTenant requests
// waiting. A refused request leaves the scheduler unchanged.
func (s *Scheduler) Enqueue(r Request) error {
	if r.ReservationID == "" {
		return ErrNoReservation
	}
	if r.EstimatedCost <= 0 || r.EstimatedCost > MaxCost {
		return ErrInvalidCost
	}
	t := s.tenants[r.Tenant]
	var d declaration
	if t == nil {
		var declared bool
		if d, declared = s.declared[r.Tenant]; !declared {
			return ErrUnknownTenant
		}
	}
	if s.ids[r.ReservationID] != nil {
		return ErrDuplicateReservation
	}
	if t == nil {
		// Forgotten (or never enqueued): it starts afresh, as a kept tenant
		// at or behind the clock would (see Scheduler).
		t = s.hold(r.Tenant, d.weight, d.level)
	}
	if t.queue.n >= s.maxQueue {
		return ErrQueueFull
	}
	s.seq++
	res := s.newReservation()
	res.t = t
	t.queue.push(slot{req: r, seq: s.seq, res: res})
	s.ids[r.ReservationID] = res
	s.idsPeak = max(s.idsPeak, len(s.ids))
	s.queued++
	lv := t.level
	lv.queued++
	if lv.queued == 1 {
		s.activateLevel(lv)
	}
	if t.queue.n == 1 {
		// The tenant was idle: it restarts at the level's clock, keeping at
		// most one quantum of the credit it had (settles of overestimated
		// work while idle, or simply having been away).
		if floor := s.newTenantVtime(lv, t.weight); t.vtime < floor {
			t.vtime = floor
		}
		lv.heap.push(heapEntry{key: t.vtime + charge(r.EstimatedCost, t.weight), seq: s.seq, t: t})
	}
	if s.meter != nil {
		s.meter.Enqueued(t.name, lv.priority, t.weight, r.EstimatedCost)
	}
	s.sweep()
	return nil
}

// Dispatch removes and returns the next request, true; or the zero Request,
// false when nothing is queued. The next request is the one with the
// smallest virtual finish time (ties: earliest enqueued) within the level
// chosen by the PriorityMode: the highest non-empty level (strict), or the
// non-empty level with the smallest level finish time (weighted).
//
// Dispatch is work-conserving: it returns a request whenever Len() > 0.
// The request stays known until Settle.
func (s *Scheduler) Dispatch() (Request, bool) {
	lv, levelKey := s.pickLevel()
	if lv == nil {
		return Request{}, false
	}
	top := lv.heap[0]
	t := top.t
	sl := t.queue.pop()
	prevVtime := t.vtime
	t.vtime = top.key
	if top.key > lv.clock {
		lv.clock = top.key
	}
	if t.queue.n > 0 {
		head := t.queue.front()
		lv.heap.replaceTop(heapEntry{key: t.vtime + charge(head.req.EstimatedCost, t.weight), seq: head.seq, t: t})
	} else {
		lv.heap.popTop()
	}
	lv.queued--
	s.queued--
	s.inflight++
	t.inflight++
	var levelCharge int64
	if s.mode == PriorityWeighted {
		levelCharge = levelKey - lv.vtime
		lv.vtime = levelKey
		if levelKey > s.topClock {
			s.topClock = levelKey
		}
	}
	*sl.res = reservation{
		t:            t,
		lv:           lv,
		dispatched:   true,
		tenantCharge: top.key - prevVtime,
		levelCharge:  levelCharge,
		tenantWeight: t.weight,
		levelWeight:  lv.weight,
	}
	if lv.clock > s.rebaseAt {
		s.rebaseLevel(lv)
	}
	if s.topClock > s.rebaseAt {
		s.rebaseTop()
	}
	if s.meter != nil {
		s.meter.Dispatched(sl.req.ReservationID, t.name, sl.req.EstimatedCost)
	}
	s.sweep()
	return sl.req, true
}

// Settle reports the actual cost of a dispatched request and forgets it.
// The tenant's virtual time moves back by (estimate - actual) scaled by its
// weight (forward if actual is larger), so the tenant ends up charged what
// it really used; in weighted mode its level is corrected the same way.
//
// It returns nil when settled; ErrUnknownDispatch if the id was never
// dispatched, is still queued or was already settled; ErrInvalidCost if
// actualCost is outside [0, MaxCost] (the dispatch stays unsettled).
// A request that never ran (its ledger Start failed, it was released)
// settles with actual cost 0.
func (s *Scheduler) Settle(reservationID string, actualCost int64) error {
	res := s.ids[reservationID]
	if res == nil || !res.dispatched {
		return ErrUnknownDispatch
	}
	if actualCost < 0 || actualCost > MaxCost {
		return ErrInvalidCost
	}
	delete(s.ids, reservationID)
	s.inflight--
	t := res.t
	back := res.tenantCharge - charge(actualCost, res.tenantWeight)
	t.vtime -= back
	if t.heapIndex >= 0 {
		h := t.level.heap
		h[t.heapIndex].key -= back
		h.fix(t.heapIndex)
	}
	if s.mode == PriorityWeighted {
		res.lv.vtime -= res.levelCharge - charge(actualCost, res.levelWeight)
	}
	s.ids = compactMap(s.ids, &s.idsPeak)
	s.recycle(res)
	if t.inflight--; t.inflight == 0 && t.queue.n == 0 {
		s.markIdle(t)
	}
	if s.meter != nil {
		s.meter.Settled(reservationID, actualCost)
	}
	s.sweep()
	return nil
}

// Len returns the number of queued (not yet dispatched) requests.
func (s *Scheduler) Len() int { return s.queued }

// InFlight returns the number of dispatched requests not yet settled.
func (s *Scheduler) InFlight() int { return s.inflight }

// QueueLen returns the number of requests the tenant has waiting; 0 for an
// unknown tenant.
func (s *Scheduler) QueueLen(tenant string) int {
	if t := s.tenants[tenant]; t != nil {
		return t.queue.n
	}
	return 0
}

// hold creates the state of a tenant that has none: idle, at its level's
// clock with a full credit, as a tenant kept since it was last at or behind
// the clock would be when it becomes backlogged.
func (s *Scheduler) hold(name string, weight int64, lv *level) *tenant {
	t := &tenant{name: name, weight: weight, level: lv, vtime: s.newTenantVtime(lv, weight), heapIndex: -1}
	s.tenants[name] = t
	s.tenantsPeak = max(s.tenantsPeak, len(s.tenants))
	return t
}

// markIdle queues a tenant that has nothing queued or in flight for sweep.
func (s *Scheduler) markIdle(t *tenant) {
	if !t.onIdle {
		t.onIdle = true
		s.idle.push(t)
	}
}

// sweep examines the sweepPerCall oldest tenants on the idle ring: one
// that became busy again leaves it (Settle puts it back when it is idle
// again); one at or behind its level's clock by the largest credit is
// forgotten; one still ahead goes to the back, to be looked at again once
// the clock may have passed it. Every idle tenant is on the ring, so each
// is looked at within len(ring)/sweepPerCall calls.
func (s *Scheduler) sweep() {
	if s.keepIdle {
		return
	}
	for range min(sweepPerCall, s.idle.n) {
		t := s.idle.pop()
		t.onIdle = false
		switch {
		case t.queue.n > 0 || t.inflight > 0:
			// Busy again: Settle puts it back once it is idle.
		case t.vtime <= s.newTenantVtime(t.level, 1):
			s.forget(t)
		default:
			s.markIdle(t)
		}
	}
	s.idle.shrink()
}

// forget drops an idle tenant's state.
func (s *Scheduler) forget(t *tenant) {
	delete(s.tenants, t.name)
	s.tenants = compactMap(s.tenants, &s.tenantsPeak)
}

// compactMap returns m, or a copy of it once deletes have left it at an
// eighth of its peak size *peak (which it then resets): Go maps keep the
// memory of their largest size, and a burst must not pin it.
// The copy walks the old map's capacity, which the deletes since the peak
// have paid for, so the cost is amortised O(1) per delete.
func compactMap[K comparable, V any](m map[K]V, peak *int) map[K]V {
	*peak = max(*peak, len(m))
	if *peak < 1024 || len(m) > *peak/8 {
		return m
	}
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	*peak = len(c)
	return c
}

// recycle keeps a settled request's record for a later Enqueue, up to as
// many as are in use (and at least 64), so steady state allocates nothing;
// once the free records are twice that, the surplus and its array go back to
// the GC (the copy costs less than the settles that made the surplus).
func (s *Scheduler) recycle(res *reservation) {
	limit := max(64, s.queued+s.inflight)
	if len(s.free) < limit {
		*res = reservation{}
		s.free = append(s.free, res)
	}
	if len(s.free) > 2*limit {
		s.free = slices.Clone(s.free[:limit])
	}
}

// newReservation returns a zeroed record, recycled if one is free.
func (s *Scheduler) newReservation() *reservation {
	if n := len(s.free); n > 0 {
		res := s.free[n-1]
		s.free = s.free[:n-1]
		return res
	}
	return new(reservation)
}

// charge is the virtual time a cost takes at a weight.
func charge(cost, weight int64) int64 { return cost * VirtualScale / weight }

// credit is the most virtual time an idle flow of this weight may lag
// behind its clock when it becomes backlogged.
func (s *Scheduler) credit(weight int64) int64 { return charge(s.quantum, weight) }

// newTenantVtime is the virtual time of a tenant new to lv at this weight:
// the level's clock less its whole credit (one quantum). It is the one rule
// for a tenant's credit, used wherever a tenant starts afresh (hold, a move
// to another level while nothing is queued), wherever an idle tenant comes
// back (Enqueue raises it to this), and to tell an idle tenant that has its
// whole credit (at or below this), which says nothing a new tenant's state
// would not: sweep forgets it once that holds at weight 1, and SetTenant
// gives it a new tenant's credit when its weight changes.
func (s *Scheduler) newTenantVtime(lv *level, weight int64) int64 {
	return lv.clock - s.credit(weight)
}

// activateLevel applies the idle-credit rule one layer up, when a level
// gets its first queued request.
func (s *Scheduler) activateLevel(lv *level) {
	if s.mode != PriorityWeighted {
		return
	}
	if floor := s.topClock - s.credit(lv.weight); lv.vtime < floor {
		lv.vtime = floor
	}
}

// pickLevel returns the level to dispatch from and, in weighted mode, the
// level's finish time for its next request; nil when nothing is queued.
// Levels are few, so a scan is cheaper than a second heap.
func (s *Scheduler) pickLevel() (*level, int64) {
	if s.queued == 0 {
		return nil, 0
	}
	if s.mode == PriorityStrict {
		for _, lv := range s.levels {
			if lv.queued > 0 {
				return lv, 0
			}
		}
		panic("sched: queued count disagrees with the levels")
	}
	var best *level
	var bestKey int64
	for _, lv := range s.levels { // highest priority first: it wins ties
		if lv.queued == 0 {
			continue
		}
		key := lv.vtime + charge(lv.heap[0].t.queue.front().req.EstimatedCost, lv.weight)
		if best == nil || key < bestKey {
			best, bestKey = lv, key
		}
	}
	if best == nil {
		panic("sched: queued count disagrees with the levels")
	}
	return best, bestKey
}

// levelFor returns the level of a priority, creating it (weight 1) if new.
func (s *Scheduler) levelFor(priority int) *level {
	i := sort.Search(len(s.levels), func(i int) bool { return s.levels[i].priority <= priority })
	if i < len(s.levels) && s.levels[i].priority == priority {
		return s.levels[i]
	}
	lv := &level{priority: priority, weight: 1, vtime: s.topClock - s.credit(1)}
	s.levels = append(s.levels, nil)
	copy(s.levels[i+1:], s.levels[i:])
	s.levels[i] = lv
	return lv
}

// rebaseLevel shifts every virtual time on a level's clock down by the
// clock, so that int64 virtual times never overflow. Only differences
// between virtual times matter, so the dispatch order is unchanged; idle
// tenants further behind than their credit are raised to it, which their
// next Enqueue would do anyway. At VirtualScale 2^20 this runs after about
// 2^40 cost units per unit of weight, so its cost, O(tenants held: forgotten
// ones have no virtual time to shift), is negligible.
func (s *Scheduler) rebaseLevel(lv *level) {
	shift := lv.clock
	lv.clock = 0
	for _, t := range s.tenants {
		if t.level != lv {
			continue
		}
		t.vtime -= shift
		if floor := s.newTenantVtime(lv, t.weight); t.heapIndex < 0 && t.vtime < floor {
			t.vtime = floor
		}
	}
	for i := range lv.heap {
		lv.heap[i].key -= shift
	}
}

// rebaseTop is rebaseLevel for the level layer of weighted mode.
func (s *Scheduler) rebaseTop() {
	shift := s.topClock
	s.topClock = 0
	for _, lv := range s.levels {
		lv.vtime -= shift
		if floor := -s.credit(lv.weight); lv.queued == 0 && lv.vtime < floor {
			lv.vtime = floor
		}
	}
}
