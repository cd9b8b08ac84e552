package sim

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/sched"
)

// Fairness in the simulation: every executor runs the real sched.Scheduler
// over the reserved requests dispatched to it, with a few execution slots,
// so queues form under load. A sched.Meter watches it in windows: a window
// opens when at least two tenants are backlogged and closes after a fixed
// number of dispatches (an executor crash discards it). The length is fixed
// so that when a window ends does not depend on who was served in it:
// closing it when a tenant runs dry would end windows just as a fast-served
// (heavy) tenant emptied its queue, and bias the figures. Each closed
// window gives
//
//   - its RFE, checked against the bound of docs/FAIRNESS.md,
//     RFE <= (M + 3·c·E)·2/w_min (M the largest estimate, c the slots, E the
//     largest estimate error seen); above it is a GateFairness violation;
//   - each tenant's served cost and weighted max-min fair share, summed by
//     tenant weight over all windows of all interleavings: the per-tenant
//     error of a weight class, |served - fair| / fair, must stay within the
//     fairness budget (the policies' default, ledger.DefaultFairnessBudget).

// maxWeight is the largest tenant weight the simulated policies draw.
const maxWeight = 4

// minFairWindows is how many windows a weight class needs before its
// aggregate error is gated (fewer is too little service to judge).
const minFairWindows = 200

// FairnessResult is one interleaving's fairness figures.
type FairnessResult struct {
	Windows int64
	// Served and Fair sum, by tenant weight, the cost served and the fair
	// share over the closed windows.
	Served [maxWeight + 1]float64
	Fair   [maxWeight + 1]float64
	// WindowsBy counts, by weight, the windows a tenant of that weight took
	// part in.
	WindowsBy [maxWeight + 1]int64
	// WorstRFE is the largest RFE / bound of a window.
	WorstRFE float64
	// Judged counts the tenants whose fair share over the interleaving's
	// windows reached MinFairServed, so their error e_i was checked
	// against their policy's fairness budget; WorstTenant is the largest
	// e_i / budget among them.
	Judged      int64
	WorstTenant float64
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
		s.WindowsBy[w] += r.WindowsBy[w]
	}
	s.WorstRFE = math.Max(s.WorstRFE, r.WorstRFE)
	s.Judged += r.Judged
	s.WorstTenant = math.Max(s.WorstTenant, r.WorstTenant)
}

func (s *FairnessSummary) merge(o *FairnessSummary) { s.add(&o.FairnessResult) }

// ClassError returns the aggregate per-tenant error of weight class w.
func (s *FairnessSummary) ClassError(w int) float64 {
	if s.Fair[w] == 0 {
		return 0
	}
	return math.Abs(s.Served[w]-s.Fair[w]) / s.Fair[w]
}

// Failures returns the weight classes whose error exceeds the budget.
func (s *FairnessSummary) Failures() []string {
	var out []string
	for w := 1; w <= maxWeight; w++ {
		if s.WindowsBy[w] >= minFairWindows && s.ClassError(w) > ledger.DefaultFairnessBudget {
			out = append(out, fmt.Sprintf("fairness: tenants of weight %d got %.0f against a fair %.0f (error %.4f > budget %.2f)",
				w, s.Served[w], s.Fair[w], s.ClassError(w), ledger.DefaultFairnessBudget))
		}
	}
	return out
}

func (s *FairnessSummary) write(out io.Writer) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "FAIRNESS (sched, %d windows)\tWINDOWS\tSERVED\tFAIR SHARE\tERROR\tBUDGET\t\n", s.Windows)
	for w := 1; w <= maxWeight; w++ {
		mark := "ok"
		switch {
		case s.WindowsBy[w] < minFairWindows:
			mark = fmt.Sprintf("(under %d windows: not gated)", minFairWindows)
		case s.ClassError(w) > ledger.DefaultFairnessBudget:
			mark = "FAIL"
		}
		fmt.Fprintf(tw, "tenants of weight %d\t%d\t%.0f\t%.0f\t%.4f\t%.2f %s\t\n", w, s.WindowsBy[w], s.Served[w], s.Fair[w],
			s.ClassError(w), ledger.DefaultFairnessBudget, mark)
	}
	fmt.Fprintf(tw, "worst window RFE / bound\t\t\t\t%.3f\t1.00\t\n", s.WorstRFE)
	fmt.Fprintf(tw, "worst tenant e_i / budget (not gated)\t%d\t\t>= %d\t%.3f\t\t\n", s.Judged, MinFairServed, s.WorstTenant)
	tw.Flush()
}

// fairness is an interleaving's fairness bookkeeping.
type fairness struct {
	res FairnessResult
	// maxEstimate and maxError are M and E of the RFE bound, over the
	// requests dispatched so far.
	maxEstimate int64
	maxError    int64
	// served and fair sum, per tenant subject, the cost served and the
	// fair share over the interleaving's closed windows (all executors).
	served, fair map[string]float64
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
	e.q = execSched{s: s, meter: meter, slots: e.q.slots, busy: e.q.busy, weight: map[string]int64{}}
	w.op.refresh(w)
	for t := range w.tenants {
		name := w.tenants[t].subject
		weight := w.op.base[w.tenants[t].key].FairnessWeight
		// The scheduler takes the weight from the policy as the ledger
		// stores it (as a gateway reads it); the meter judges by the
		// weight the operator asked for.
		schedWeight := weight
		if g, ok := ledger.NewActiveGenerations(w.op.policies).Active(w.tenants[t].key); ok {
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
	err := e.q.s.Enqueue(sched.Request{ReservationID: r.id, Tenant: name, EstimatedCost: cost})
	if err != nil {
		w.violate(GateProtocol, fmt.Sprintf("sched.Enqueue %s: %v", r.id, err))
		return
	}
	e.q.meter.Enqueued(name, 0, e.q.weight[name], cost)
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
		req, ok := e.q.s.Dispatch()
		if !ok {
			w.violate(GateFairness, "sched.Dispatch returned nothing with requests queued (not work-conserving)")
			return
		}
		e.q.busy++
		e.q.meter.Dispatched(req.ReservationID, req.Tenant, req.EstimatedCost)
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
		w.fair.maxError = max(w.fair.maxError, abs64(r.units[0]-actual))
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
	snap := q.meter.Snapshot()
	for _, tf := range snap {
		if tf.Weight < 1 || tf.Weight > maxWeight {
			continue
		}
		var capacity float64
		for _, o := range snap {
			if o.Priority == tf.Priority {
				capacity += float64(o.Served)
			}
		}
		f.Served[tf.Weight] += float64(tf.Served)
		f.Fair[tf.Weight] += tf.FairShare * capacity
		f.WindowsBy[tf.Weight]++
		if w.fair.served == nil {
			w.fair.served, w.fair.fair = map[string]float64{}, map[string]float64{}
		}
		if tf.Backlogged {
			// Judged per tenant only where its demand was unlimited the
			// whole window, so its fair share does not rest on an estimate
			// of demand that expiry or rejection took away.
			w.fair.served[tf.Tenant] += float64(tf.Served)
			w.fair.fair[tf.Tenant] += tf.FairShare * capacity
		}
	}
}

// tenantFairness checks, at the end of an interleaving, each tenant's
// fairness error over its windows, e_i = |served - fair| / fair, against
// the fairness budget of the tenant's policy, for every tenant whose fair
// share reached MinFairServed (tiny samples do not decide).
func (w *world) tenantFairness() {
	f := &w.fair
	for t := range w.tenants {
		name := w.tenants[t].subject
		fair := f.fair[name]
		if fair < MinFairServed {
			continue
		}
		budget := w.op.base[w.tenants[t].key].FairnessBudget
		e := math.Abs(f.served[name]-fair) / fair
		f.res.Judged++
		f.res.WorstTenant = math.Max(f.res.WorstTenant, e/budget)
		if e > budget && gateTenantFairness {
			w.violate(GateFairness, fmt.Sprintf("tenant %s (weight %d) was served %.0f against a fair share of %.0f over %d windows: error %.4f > its policy's fairness budget %.2f",
				name, w.op.base[w.tenants[t].key].FairnessWeight, f.served[name], fair, f.res.Windows, e, budget))
			return
		}
	}
}

// MinFairServed is the fair share (in cost units) a tenant must reach over
// an interleaving before its fairness error is judged.
const MinFairServed = 1000

// gateTenantFairness: the per-tenant, per-interleaving error is measured
// and reported (FairnessResult.WorstTenant), not gated: see
// docs/SIMULATOR.md, "Fairness", for why the samples are too small.
const gateTenantFairness = false
