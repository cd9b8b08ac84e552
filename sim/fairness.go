package sim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/sched"
)

// Fairness in the simulation: every executor runs the real sched.Scheduler
// over the reserved requests dispatched to it, with a few execution slots,
// so queues form under load. A sched.Meter watches it in windows: a window
// opens when at least two tenants are backlogged and closes after a fixed
// number of dispatches (an executor crash discards it). Each closed window's
// RFE is checked against the bound of docs/FAIRNESS.md,
// RFE <= (M + 3·c·E)·2/w_min (M the largest estimate, c the slots, E the
// largest estimate error seen); above it is a GateFairness violation.
//
// Each tenant is judged on its own, in each interleaving, against its own
// policy's budget: over stretches (syncStretch, closeStretch), spans with
// the same backlogged tenants, once its fair share is large enough that
// the scheduler's proven bound promises the budget (tenantFairness,
// GateTenantFairness). The tenants whose bound promises
// ledger.DefaultFairnessBudget are also summed by weight over the run: a
// weight class's |served - fair| / fair must stay within that budget,
// which a correct scheduler cannot exceed, however small the run.
//
// The class figures used to be summed over the 8-dispatch windows, with no
// bound: a window's fair share spreads its 8 dispatches over every tenant
// queued in it, and with more tenants than dispatches (64 or 256 tenants)
// the correct scheduler was off by 0.17-0.95 per class, while every tenant
// stayed within its proven bound.

// maxWeight is the largest tenant weight the simulated policies draw.
const maxWeight = 4

// FairnessResult is one interleaving's fairness figures.
type FairnessResult struct {
	Windows int64
	// Served and Fair sum, by tenant weight, the cost served and the fair
	// share over the stretches of the tenants (one per executor) whose fair
	// share is large enough that the scheduler's bound promises
	// ledger.DefaultFairnessBudget; ClassJudged counts those tenants.
	Served      [maxWeight + 1]float64
	Fair        [maxWeight + 1]float64
	ClassJudged [maxWeight + 1]int64
	// WorstRFE is the largest RFE / bound of a window.
	WorstRFE float64
	// Judged counts the tenants whose fair share over the stretches they
	// were backlogged through was large enough to judge (tenantFairness),
	// so their error e_i was checked against their policy's fairness
	// budget; WorstTenant is the largest e_i / budget among them.
	Judged      int64
	WorstTenant float64
	// Stretches counts the stretches; WorstBound is the largest
	// |served - fair| / bound of a tenant over its stretches (judged or
	// not): the share of the scheduler's proven bound it used.
	Stretches  int64
	WorstBound float64
}

// FairnessSummary aggregates FairnessResults.
type FairnessSummary struct {
	FairnessResult
}

func (s *FairnessSummary) add(r *FairnessResult) {
	s.Windows += r.Windows
	for w := range r.Served {
		s.Served[w] += r.Served[w]
		s.Fair[w] += r.Fair[w]
		s.ClassJudged[w] += r.ClassJudged[w]
	}
	s.WorstRFE = math.Max(s.WorstRFE, r.WorstRFE)
	s.Judged += r.Judged
	s.WorstTenant = math.Max(s.WorstTenant, r.WorstTenant)
	s.Stretches += r.Stretches
	s.WorstBound = math.Max(s.WorstBound, r.WorstBound)
}

func (s *FairnessSummary) merge(o *FairnessSummary) { s.add(&o.FairnessResult) }

// ClassError returns the aggregate per-tenant error of weight class w.
func (s *FairnessSummary) ClassError(w int) float64 {
	if s.Fair[w] == 0 {
		return 0
	}
	return math.Abs(s.Served[w]-s.Fair[w]) / s.Fair[w]
}

// Failures returns the weight classes whose error exceeds the budget. Every
// tenant summed into a class is within the budget by the scheduler's
// proven bound, so the class is too: any sample is judged.
func (s *FairnessSummary) Failures() []string {
	var out []string
	for w := 1; w <= maxWeight; w++ {
		if s.ClassJudged[w] > 0 && s.ClassError(w) > ledger.DefaultFairnessBudget {
			out = append(out, fmt.Sprintf("fairness: tenants of weight %d got %.0f against a fair %.0f (error %.4f > budget %.2f)",
				w, s.Served[w], s.Fair[w], s.ClassError(w), ledger.DefaultFairnessBudget))
		}
	}
	return out
}

// write writes the fairness table; an interrupted run's rows are marked
// not judged (its verdict is for a whole run).
func (s *FairnessSummary) write(out io.Writer, interrupted bool) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "FAIRNESS (sched, %d windows)\tJUDGED\tSERVED\tFAIR SHARE\tERROR\tBUDGET\t\n", s.Windows)
	for w := 1; w <= maxWeight; w++ {
		mark := "ok"
		switch {
		case interrupted:
			mark = "- (not judged: interrupted)"
		case s.ClassJudged[w] == 0:
			mark = "(no tenant judged)"
		case s.ClassError(w) > ledger.DefaultFairnessBudget:
			mark = "FAIL"
		}
		fmt.Fprintf(tw, "tenants of weight %d\t%d\t%.0f\t%.0f\t%.4f\t%.2f %s\t\n", w, s.ClassJudged[w], s.Served[w], s.Fair[w],
			s.ClassError(w), ledger.DefaultFairnessBudget, mark)
	}
	fmt.Fprintf(tw, "worst window RFE / bound\t\t\t\t%.3f\t1.00\t\n", s.WorstRFE)
	fmt.Fprintf(tw, "tenants judged, each in its interleaving (%d stretches)\t%d\t\t\t\t\t\n", s.Stretches, s.Judged)
	fmt.Fprintf(tw, "worst tenant e_i / its budget\t\t\t\t%.3f\t1.00\t\n", s.WorstTenant)
	fmt.Fprintf(tw, "worst tenant |served - fair| / bound\t\t\t\t%.3f\t\t\n", s.WorstBound)
	tw.Flush()
}

// fairness is an interleaving's fairness bookkeeping.
type fairness struct {
	res FairnessResult
	// maxEstimate and maxError are M and E of the RFE bound, over the
	// requests dispatched so far.
	maxEstimate int64
	maxError    int64
	// served, fair and bound sum, per executor and tenant (index
	// executor*len(world.tenants)+tenant), the cost served, the fair
	// share and the scheduler's bound on their difference over the
	// stretches the tenant was backlogged through at that executor. Each
	// executor's scheduler is judged on its own: their bounds differ by
	// the size of the requests each runs.
	served, fair, bound []float64
}

func (f *fairness) result() FairnessResult { return f.res }

// execSched is an executor's scheduler state.
type execSched struct {
	s      *sched.Scheduler
	meter  *sched.Meter
	slots  int
	busy   int
	open   bool // a window is open
	count  int  // dispatches in the open window
	minW   int64
	weight map[string]int64

	// The stretch meter judges each tenant (tenantFairness): a stretch is
	// a span of time in which the set of backlogged tenants (a request
	// queued) stays the same and has 2 or more members. It ends, and is
	// summed into its tenants' figures, when a tenant joins (before its
	// request is counted) or one runs dry (just after its last dispatch).
	stretch    *sched.Meter
	stretchOn  bool
	stretchSet []bool // stretchSet[t]: tenant t was backlogged when it began
	backlogged []bool // syncStretch's scratch: who is backlogged now
	// maxEstimate and maxError are M and E of the bound for this
	// scheduler, over every request it was given since it was created.
	maxEstimate, maxError int64
}

func (w *world) newExecSched(e *executor) {
	// The meter is fed by the simulation with the policies' weights (not
	// by the scheduler), so that a scheduler that got the weights wrong is
	// measured against the right ones.
	meter := sched.NewMeter()
	s, err := sched.New(sched.Config{MaxQueuePerTenant: 1 << 16})
	if err != nil {
		panic("sim: sched.New with a valid config: " + err.Error())
	}
	e.q = execSched{s: s, meter: meter, stretch: sched.NewMeter(), slots: e.q.slots, busy: e.q.busy, weight: map[string]int64{}}
	w.op.refresh(w)
	for t := range w.tenants {
		name := w.tenants[t].subject
		weight := w.op.base[w.tenants[t].key].FairnessWeight
		// The scheduler takes the weight from the policy as the ledger
		// stores it (as a gateway reads it); the meter judges by the
		// weight the operator asked for.
		schedWeight := weight
		if g, ok := ledger.NewActiveGenerations(w.op.policies).Deciding(w.tenants[t].key); ok {
			if p := w.op.policy(g); p != nil {
				schedWeight = p.FairnessWeight
			}
		}
		if w.hooks.ignoreWeights {
			schedWeight = 1 // the negative control: a scheduler blind to weights
		}
		if err := s.SetTenant(name, schedWeight, 0); err != nil {
			panic("sim: sched.SetTenant: " + err.Error())
		}
		e.q.weight[name] = weight
	}
}

// enqueue queues a reserved request at its executor's scheduler and
// dispatches what the free slots allow.
func (w *world) enqueue(r *request) {
	e := &w.execs[r.exec]
	name, cost := w.tenants[r.tenant].subject, max(r.units[0], 1)
	if e.q.s.QueueLen(name) == 0 {
		// A tenant joining the backlogged ones ends the stretch before its
		// demand is counted: it was not there to be served.
		w.closeStretch(e)
	}
	err := e.q.s.Enqueue(sched.Request{ReservationID: r.id, Tenant: name, EstimatedCost: cost})
	if err != nil {
		w.violate(GateProtocol, fmt.Sprintf("sched.Enqueue %s: %v", r.id, err))
		return
	}
	e.q.meter.Enqueued(name, 0, e.q.weight[name], cost)
	e.q.stretch.Enqueued(name, 0, e.q.weight[name], cost)
	e.q.maxEstimate = max(e.q.maxEstimate, cost)
	w.pump(r.exec)
}

// pump dispatches queued requests into free slots, in the scheduler's
// order, and opens or closes fairness windows.
func (w *world) pump(i int) {
	e := &w.execs[i]
	if !e.up {
		return
	}
	for e.q.busy < e.q.slots && e.q.s.Len() > 0 {
		w.fairnessWindow(e)
		w.syncStretch(e)
		req, ok := e.q.s.Dispatch()
		if !ok {
			w.violate(GateFairness, "sched.Dispatch returned nothing with requests queued (not work-conserving)")
			return
		}
		e.q.busy++
		e.q.meter.Dispatched(req.ReservationID, req.Tenant, req.EstimatedCost)
		e.q.stretch.Dispatched(req.ReservationID, req.Tenant, req.EstimatedCost)
		if e.q.s.QueueLen(req.Tenant) == 0 {
			w.closeStretch(e) // it ran dry: its last dispatch is the stretch's last
		}
		if e.q.open {
			e.q.count++
		}
		r := w.requestByID(req.ReservationID, i)
		if r == nil {
			w.violate(GateProtocol, "sched dispatched unknown reservation "+req.ReservationID)
			return
		}
		w.fair.maxEstimate = max(w.fair.maxEstimate, req.EstimatedCost)
		w.startOp(r)
	}
	w.fairnessWindow(e)
	w.syncStretch(e)
}

func (w *world) requestByID(id string, exec int) *request {
	for _, r := range w.requests {
		if r.id == id && r.exec == exec && r.phase == phDispatched {
			return r
		}
	}
	return nil
}

// slotFree ends a dispatched request's use of its executor slot: its
// operation finished (actual cost) or never started (cost 0).
func (w *world) slotFree(r *request, actual int64) {
	e := &w.execs[r.exec]
	if r.slot {
		r.slot = false
		e.q.busy--
	}
	if r.schedKnown {
		r.schedKnown = false
		if err := e.q.s.Settle(r.id, actual); err != nil {
			w.violate(GateProtocol, fmt.Sprintf("sched.Settle %s: %v", r.id, err))
			return
		}
		e.q.meter.Settled(r.id, actual)
		e.q.stretch.Settled(r.id, actual)
		w.fair.maxError = max(w.fair.maxError, abs64(r.units[0]-actual))
		e.q.maxError = max(e.q.maxError, abs64(max(r.units[0], 1)-actual))
	}
	w.pump(r.exec)
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// windowDispatches is the length of a fairness window.
const windowDispatches = 8

// fairnessWindow opens a window when two tenants are backlogged and closes
// it after windowDispatches dispatches.
func (w *world) fairnessWindow(e *executor) {
	q := &e.q
	if q.open {
		if q.count >= windowDispatches {
			w.closeWindow(e)
		}
		return
	}
	backlogged := 0
	minW := int64(math.MaxInt64)
	for t := range w.tenants {
		name := w.tenants[t].subject
		if q.s.QueueLen(name) > 0 {
			backlogged++
			minW = min(minW, q.weight[name])
		}
	}
	if backlogged >= 2 {
		q.meter.StartWindow()
		q.open, q.count, q.minW = true, 0, minW
	}
}

func (w *world) closeWindow(e *executor) {
	q := &e.q
	q.open = false
	rfe := q.meter.RFE()
	bound := float64(w.fair.maxEstimate+3*int64(q.slots)*w.fair.maxError) * 2 / float64(q.minW)
	f := &w.fair.res
	f.Windows++
	if bound > 0 {
		f.WorstRFE = math.Max(f.WorstRFE, rfe/bound)
	}
	if rfe > bound {
		w.violate(GateFairness, fmt.Sprintf("a fairness window's RFE %.1f exceeds the bound %.1f of docs/FAIRNESS.md (M=%d, c=%d, E=%d, w_min=%d)",
			rfe, bound, w.fair.maxEstimate, q.slots, w.fair.maxError, q.minW))
		return
	}
}

// syncStretch begins a stretch when two or more tenants are backlogged and
// none is open, and ends the open one if its set of backlogged tenants
// changed.
func (w *world) syncStretch(e *executor) {
	q := &e.q
	if len(q.backlogged) != len(w.tenants) {
		q.backlogged = make([]bool, len(w.tenants))
		q.stretchSet = make([]bool, len(w.tenants))
	}
	n := 0
	for t := range w.tenants {
		q.backlogged[t] = q.s.QueueLen(w.tenants[t].subject) > 0
		if q.backlogged[t] {
			n++
		}
	}
	if q.stretchOn && !slices.Equal(q.backlogged, q.stretchSet) {
		w.closeStretch(e)
	}
	if !q.stretchOn && n >= 2 {
		q.stretch.StartWindow()
		q.stretchOn = true
		copy(q.stretchSet, q.backlogged)
	}
}

// closeStretch ends the executor's open stretch and adds, for each tenant
// still backlogged at its end, what it was served, its weighted max-min fair
// share (the meter's, from the actual costs) and the scheduler's bound on
// their difference: with M the largest estimate, c the slots, E the largest
// estimate error and w_min the smallest weight of the stretch's tenants,
// docs/FAIRNESS.md bounds |S_i/w_i - S_j/w_j| by (M + 3·c·E)·(1/w_i + 1/w_j);
// the fair share is w_i times a weighted mean of the S_j/w_j, so
// |S_i - F_i| <= (M + 3·c·E)·(1 + w_i/w_min).
func (w *world) closeStretch(e *executor) {
	q := &e.q
	if !q.stretchOn {
		return
	}
	q.stretchOn = false
	// Every tenant of the set was backlogged from the stretch's start to
	// its end (one that ran dry did so at the last dispatch), so each one's
	// fair share is its weight's part of what they were served together.
	snap := q.stretch.Snapshot()
	var capacity, weights float64
	minW := int64(math.MaxInt64)
	for _, tf := range snap {
		capacity += float64(tf.Served) // one priority level
	}
	for t := range w.tenants {
		if q.stretchSet[t] {
			weight := q.weight[w.tenants[t].subject]
			weights += float64(weight)
			minW = min(minW, weight)
		}
	}
	if capacity == 0 {
		return
	}
	f := &w.fair
	if f.served == nil {
		n := len(w.execs) * len(w.tenants)
		f.served, f.fair, f.bound = make([]float64, n), make([]float64, n), make([]float64, n)
	}
	f.res.Stretches++
	m := float64(q.maxEstimate + 3*int64(q.slots)*q.maxError)
	for _, tf := range snap {
		t := w.tenantIndex(tf.Tenant)
		if !q.stretchSet[t] {
			w.violate(GateProtocol, fmt.Sprintf("executor %d served tenant %s in a stretch it was not backlogged in", e.index, tf.Tenant))
			return
		}
		i := e.index*len(w.tenants) + t
		f.served[i] += float64(tf.Served)
		f.fair[i] += capacity * float64(tf.Weight) / weights
		f.bound[i] += m * (1 + float64(tf.Weight)/float64(minW))
	}
}

func (w *world) tenantIndex(subject string) int {
	for t := range w.tenants {
		if w.tenants[t].subject == subject {
			return t
		}
	}
	panic("sim: a scheduler served an unknown tenant " + subject)
}

// tenantFairness checks, at the end of an interleaving, each tenant's
// fairness error at each executor over the stretches it was backlogged
// through, e_i = |served - fair| / fair, against its own policy's fairness
// budget.
// A tenant is judged once its fair share is large enough that the
// scheduler's bound promises the budget (fair >= bound / budget) and at
// least MinFairServed: a correct scheduler then cannot fail, and a smaller
// sample does not decide.
func (w *world) tenantFairness() {
	f := &w.fair
	for i := range f.fair {
		t := i % len(w.tenants)
		fair := f.fair[i]
		if fair == 0 {
			continue
		}
		diff := math.Abs(f.served[i] - fair)
		if f.bound[i] > 0 {
			f.res.WorstBound = math.Max(f.res.WorstBound, diff/f.bound[i])
		}
		p := w.op.base[w.tenants[t].key]
		budget := p.FairnessBudget
		if fair < MinFairServed || fair < f.bound[i]/budget {
			continue
		}
		if fair >= f.bound[i]/ledger.DefaultFairnessBudget && p.FairnessWeight >= 1 && p.FairnessWeight <= maxWeight {
			// Within the default budget by the bound: the weight class's sum
			// of such tenants is too.
			f.res.Served[p.FairnessWeight] += f.served[i]
			f.res.Fair[p.FairnessWeight] += fair
			f.res.ClassJudged[p.FairnessWeight]++
		}
		e := diff / fair
		f.res.Judged++
		f.res.WorstTenant = math.Max(f.res.WorstTenant, e/budget)
		if e > budget {
			w.violate(GateTenantFairness, fmt.Sprintf("tenant %s (weight %d) was served %.0f by executor %d against a fair share of %.0f over the stretches it was backlogged through: error %.4f > its policy's fairness budget %.2f (the scheduler's bound allows %.0f)",
				w.tenants[t].subject, p.FairnessWeight, f.served[i], i/len(w.tenants), fair, e, budget, f.bound[i]))
			return
		}
	}
}

// MinFairServed is the least fair share (in cost units, over the stretches
// a tenant was backlogged through) at which a tenant's fairness error is
// judged, whatever the bound allows.
const MinFairServed = 200
