package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// DefaultPageSize is how many accounts one page of the epoch and drain
// workers reads (and so the most commands one of their batches holds).
const DefaultPageSize = 256

// Pager walks the worker indexes (store.DueIndexes) one bounded page at a
// time and turns each page into worker commands. Make one with
// Core.EpochPager or Core.DrainPager; call Next until it returns no
// commands and a nil error. A Pager reads committed state page by page, so
// rows that change between pages are seen as they were when their page was
// read; the ledger's commands are idempotent and decide for themselves,
// so a candidate seen twice costs a no-op.
type Pager struct {
	core  *Core
	size  int
	scans []scan
	cur   int
	after store.EpochCursor
	// found counts the commands the current scan produced; holding
	// whether an account it read held reservations or may still hold its
	// subject's capacity (mayStayCurrent).
	found   int
	holding bool
	// collect, when positive, has the scans list up to that many
	// accounts each that got a command, held reservations or may still
	// hold their subject's capacity (waiting;
	// overflow once there were more): ScanEnd.Waiting.
	collect  int
	waiting  []ledger.AccountKey
	overflow bool
	// listed counts the accounts all its scans listed, at most
	// drainMemoPoints (a scan past that overflows).
	listed int
	// ended are the scans that ran to their end, with what they found
	// (Ended).
	ended []ScanEnd
	// points are single accounts to look at after the scans (drains of a
	// subject's own-policy account under a still-active AnySubject
	// generation).
	points []ledger.AccountKey
	// lengths are the epoch lengths of the generations an EpochPager
	// scans (the engine's epochWatch); now is its clock and newest the
	// newest generation it listed (EpochScans.Update).
	lengths []time.Duration
	now     time.Time
	newest  uint64
	// gens are the generations it knew that have an epoch length, by
	// generation (EpochScans keeps them for the next pager).
	gens []epochGeneration
	done bool
	// prepare, when set, is called with each page before make sees its
	// accounts (a drain pager reads what decides for their subjects).
	prepare func(ctx context.Context, page []ledger.Account) error
	// make turns an account of a page into a command, or reports none.
	make func(a *ledger.Account) (ledger.Command, bool)
	// switchable, when set (a drain pager for the memo), reports whether
	// an account that got no command may still be its subject's current
	// account under a generation that refills (see mayStayCurrent);
	// live reports whether a generation is one the pager knows and not
	// rolled back.
	switchable func(a *ledger.Account) bool
	live       func(generation uint64) bool
}

// scan is one generation's pass over AccountsByEpoch, from from (the zero
// cursor: the start) up to epoch starts at startedBy; or, with byPoints,
// a point read of each of points, its accounts left to read; or, with
// across, a pass over the index across generations
// (store.EpochFilter.AllGenerations) that keeps the accounts keep
// accepts.
type scan struct {
	generation uint64
	startedBy  time.Time
	from       store.EpochCursor
	byPoints   bool
	points     []ledger.AccountKey
	across     bool
	keep       func(a *ledger.Account) bool
}

// epochGeneration is a generation's epoch length, as an EpochPager looks
// it up (epochLengths: by generation, in order).
type epochGeneration struct {
	generation uint64
	length     time.Duration
}

// lengthOf returns generation g's epoch length in gens (EpochPager's), or
// zero when it has none.
func lengthOf(gens []epochGeneration, g uint64) time.Duration {
	i, ok := slices.BinarySearchFunc(gens, g, func(e epochGeneration, g uint64) int { return cmp.Compare(e.generation, g) })
	if !ok {
		return 0
	}
	return gens[i].length
}

// freshPerGeneration is how many generations an epoch pass reads one by
// one, from the start of each one's index, when no earlier pass is
// remembered (a new leader, after a pass that did not complete, or when
// the clock stepped back); more are read together, by one pass from the
// start of the index across generations.
const freshPerGeneration = 16

// EpochPager returns a pager over the accounts whose accounting epoch
// ended by now (EpochStart + the generation's EpochLength <= now): the
// close-epoch commands of those whose balances changed in the epoch. An
// idle account (ledger.Account.EpochIdle) gets none: its next command
// closes its idle epochs in one statement. It reads the policies once and
// then only accounts that are due.
//
// since, when not nil, remembers the last full pass (EpochScans): every
// generation is then read only from the epoch starts that pass had not
// read, by one range of the index across generations per epoch length
// (store.EpochFilter.AllGenerations), not one read per generation; so
// accounts that stayed idle are not read again every pass, and a pass
// with nothing due costs a few reads however many generations there are
// or were published since. A generation published after that pass listed
// the policies is in those ranges too: its accounts were all opened by
// commands that committed after the listing, so stamped at most
// EpochLateness before that pass's clock, and their epochs start in the
// range. With no pass remembered (a new leader, after a pass that did
// not complete, or at a clock earlier than that pass's: it stepped back)
// every generation is read from its start: by its own index when there
// are at most freshPerGeneration, else all of them by one range from
// the start of the index across generations.
func (c *Core) EpochPager(ctx context.Context, now time.Time, pageSize int, since *EpochScans) (*Pager, error) {
	p := &Pager{core: c, size: max(pageSize, 1), now: now}
	// The generations' epoch lengths: those since remembers and the
	// generations published since (a generation and its epoch length
	// never change, and none is ever removed), else every policy.
	// They are read a page at a time (a new leader's first pass reads
	// every policy: at a million, all at once, that took about 500 MB
	// beside the server's warm load of the same).
	var gens []epochGeneration
	var after uint64
	if since != nil {
		gens, p.newest, after = slices.Clip(since.gens), since.known, since.known
	}
	err := c.eachPolicyPage(ctx, after, func(page []store.ListedPolicy) error {
		for i := range page {
			pol := &page[i].Policy
			if pol.EpochLength > 0 {
				gens = append(gens, epochGeneration{pol.Generation, pol.EpochLength})
			}
			p.newest = max(p.newest, pol.Generation)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("policies: %w", err)
	}
	p.gens = gens
	for _, e := range gens {
		if !slices.Contains(p.lengths, e.length) {
			p.lengths = append(p.lengths, e.length)
		}
	}
	read := since.last()
	if now.Round(0).Before(read.Round(0)) {
		// The clock stepped back since that pass (NTP correcting it):
		// commands since may be stamped long before that pass's clock,
		// more than EpochLateness, so their accounts' epochs may start
		// before the range it left to read. Read as a new leader does.
		// The wall clocks (Round(0)): Before compares time.Now's
		// monotonic readings when both have one, which a step does not
		// move, and commands are stamped by the wall clock.
		read = time.Time{}
	}
	switch {
	case !read.IsZero():
		lengths := slices.Sorted(slices.Values(p.lengths))
		for _, length := range lengths {
			// The epoch starts the last pass read, less EpochLateness, up
			// to those that ended by now; the empty subject sorts first,
			// so the cursor resumes at that epoch start itself. An
			// account of a generation published after this pager listed
			// the policies is not in gens (length 0): the next pass
			// reads it.
			p.scans = append(p.scans, scan{
				across: true, startedBy: now.Add(-length),
				from: store.EpochCursor{EpochStart: read.Add(-length - EpochLateness)},
				keep: func(a *ledger.Account) bool {
					return lengthOf(gens, a.Key.Generation) == length
				},
			})
		}
	case len(gens) <= freshPerGeneration:
		for _, e := range gens {
			p.scans = append(p.scans, scan{generation: e.generation, startedBy: now.Add(-e.length)})
		}
	default:
		shortest := slices.Min(p.lengths)
		p.scans = append(p.scans, scan{
			across: true, startedBy: now.Add(-shortest),
			keep: func(a *ledger.Account) bool {
				length := lengthOf(gens, a.Key.Generation)
				return length > 0 && !a.EpochStart.After(now.Add(-length))
			},
		})
	}
	if len(p.scans) > 0 {
		p.after = p.scans[0].from
	}
	p.make = func(a *ledger.Account) (ledger.Command, bool) {
		if a.EpochIdle() {
			return ledger.Command{}, false
		}
		return ledger.Command{Kind: ledger.KindCloseEpoch, Account: a.Key}, true
	}
	return p, nil
}

// EpochLateness is how much earlier than the epoch worker's clock a
// command may be stamped and still commit after the worker's pass read
// its account (a transaction's length, clock skew between replicas):
// a pass reads again the epoch starts that recent, so such an account is
// still closed in time.
const EpochLateness = 2 * time.Minute

// EpochScans remembers the last full epoch pass: its clock. It read
// every generation it knew up to the epoch starts that ended by its
// clock: an account left there was idle and stays so until a command
// touches it, which moves its epoch start to the command's epoch, past
// the mark (less EpochLateness). A generation published after it listed
// the policies (generations are numbered in the order they commit: a
// publish takes the next number under the ledger's meta row) has only
// accounts that commands opened after that, so past the same mark. The
// zero value remembers nothing (a new leader reads every due account
// once).
//
// It also keeps, across passes whether complete or not, the epoch length
// of every generation the pagers have read (16 bytes each) and the newest
// generation listed, so that a pass reads only the policies published
// since (PolicyListAfter), not every policy.
type EpochScans struct {
	at    time.Time
	gens  []epochGeneration
	known uint64
}

// last returns the clock of the last full pass s remembers (zero for
// none).
func (s *EpochScans) last() time.Time {
	if s == nil {
		return time.Time{}
	}
	return s.at
}

// Update records a pass's outcome: complete is whether it ran to its end
// (otherwise the next pass reads every generation from its start).
func (s *EpochScans) Update(p *Pager, complete bool) {
	s.gens, s.known = p.gens, p.newest
	s.at = time.Time{}
	if complete {
		s.at = p.now
	}
}

// DrainPlan says how a drain pass reads one superseded generation.
type DrainPlan struct {
	// Skip leaves it out.
	Skip bool
	// ByPoints reads only Points, its accounts that a complete earlier
	// scan listed (ScanEnd.Waiting), one point read each.
	ByPoints bool
	Points   []ledger.AccountKey
}

// drainWaitingPerGeneration bounds the accounts a drain scan lists per
// generation (ScanEnd.Waiting).
const drainWaitingPerGeneration = 4096

// drainFullReadEvery is how many drain passes in a row may take the
// policies from DrainPolicies, when PolicyChanges has not moved, before
// one reads every policy again: a replica of an older version publishes
// and rolls back without counting it (ledger.MetaPolicyChanges), and its
// changes are seen then.
const drainFullReadEvery = 10

// DrainPolicies keeps what a drain pass derived from the policies (which
// generations are superseded, which decide, which are rolled back and
// refill),
// and the store's PolicyChanges it was read at: the next pass reads every
// policy again only when that count moved (a publish or a rollback
// committed since, on any replica), after drainFullReadEvery passes
// without a full read, or after Forget (a new term as worker leader).
// The zero value knows nothing: the first pass reads every policy.
type DrainPolicies struct {
	view    *drainView
	changes uint64
	// passes counts the passes that took view without reading.
	passes int
}

// Forget makes the next pass read every policy.
func (d *DrainPolicies) Forget() { d.view = nil }

// drainView is what DrainPager derives from the policies. It holds
// nothing for a policy key whose only generation is active (a policy per
// tenant held about 99 bytes a key when it kept every key's active
// generation): a pass reads what decides for the subjects of the
// accounts it reads, a page at a time (Core.decidingOf).
type drainView struct {
	// superseded are the generations that are not their key's active
	// one, oldest first; points the accounts of subjects with an active
	// policy of their own under a still-active AnySubject generation.
	superseded []uint64
	points     []ledger.AccountKey
	// newest is the newest generation read; rolledBack are those rolled
	// back, refills the superseded ones with a dimension that refills (a
	// few entries, where a set of every live generation would hold one
	// per tenant).
	newest              uint64
	rolledBack, refills map[uint64]bool
	// digest is the digest of the active generations (digestActive), when
	// taken (newDrainView's digested).
	digest activeDigest
}

// live reports whether generation g is one v read and not rolled back.
func (v *drainView) live(g uint64) bool { return g <= v.newest && !v.rolledBack[g] }

// newDrainView derives a drainView from every policy, with the digest of
// their active generations when digested (the drain memo's key): what
// readDrainView derives page by page, from one list (the tests'
// reference).
func newDrainView(policies []ledger.Policy, digested bool) *drainView {
	active := ledger.NewActiveGenerations(policies)
	b := newDrainViewBuilder(digested)
	for i := range policies {
		pol := &policies[i]
		g, ok := active.Active(pol.Key)
		star, _ := active.Active(ledger.PolicyKey{Subject: ledger.AnySubject, Route: pol.Key.Route, Region: pol.Key.Region})
		b.add(pol, ok && g == pol.Generation, star)
	}
	return b.v
}

// drainViewBuilder derives a drainView one policy at a time, oldest
// first, each given whether it is its key's active generation
// (ledger.DecidingGeneration's rule 1, as the store's head says or
// ledger.ActiveGenerations computes) and its route's AnySubject key's
// active generation.
type drainViewBuilder struct {
	v        *drainView
	digested bool
}

func newDrainViewBuilder(digested bool) *drainViewBuilder {
	b := &drainViewBuilder{v: &drainView{rolledBack: map[uint64]bool{}, refills: map[uint64]bool{}}, digested: digested}
	if digested {
		b.v.digest = activeDigest{n: 1} // digestActive of none
	}
	return b
}

// add takes pol in: active is whether it is its key's active generation,
// star the active generation of its route's AnySubject key (0 for none;
// only asked of an active generation of a concrete subject).
func (b *drainViewBuilder) add(pol *ledger.Policy, active bool, star uint64) {
	v := b.v
	v.newest = max(v.newest, pol.Generation)
	if pol.RolledBack {
		v.rolledBack[pol.Generation] = true
	}
	if active {
		if b.digested {
			v.digest.add(pol.Key, pol.Generation)
		}
		// A concrete subject with an active policy of its own under a
		// still-active AnySubject generation of its route: that
		// generation does not decide for it, and its account there is
		// a point to drain.
		if pol.Key.Subject != ledger.AnySubject && star != 0 {
			v.points = append(v.points, ledger.AccountKey{Subject: pol.Key.Subject, Route: pol.Key.Route, Region: pol.Key.Region, Generation: star})
		}
		return // decides (for its one subject, or for its route's others)
	}
	v.superseded = append(v.superseded, pol.Generation)
	if !pol.RolledBack {
		for _, d := range pol.Dimensions {
			if d.Refills() {
				v.refills[pol.Generation] = true
			}
		}
	}
}

// readDrainView derives a drainView from every policy, read a page of
// policyPage at a time in generation order, each with whether its
// key's head names it active in the same read (store.ListedPolicy), and
// the active generations of the pages' AnySubject keys (one
// store.Store.PolicyHeads read per page that needs one it has not read).
// Without a change meanwhile its findings are newDrainView's over one
// read of every policy. A publish or a rollback that commits during the
// read may show in the pages after it and not in those before; it moves
// store.Store.PolicyChanges, which the caller read before the first page,
// so the next pass reads every page again (and a drain picked on a stale
// view costs one no-op: the ledger drains to what decides at commit).
func (c *Core) readDrainView(ctx context.Context, digested bool) (*drainView, error) {
	b := newDrainViewBuilder(digested)
	stars := map[ledger.PolicyKey]uint64{}
	err := c.eachPolicyPage(ctx, 0, func(page []store.ListedPolicy) error {
		var unread []ledger.PolicyKey
		for i := range page {
			key := page[i].Policy.Key
			star := ledger.PolicyKey{Subject: ledger.AnySubject, Route: key.Route, Region: key.Region}
			if _, ok := stars[star]; !ok && page[i].Active && key.Subject != ledger.AnySubject && !slices.Contains(unread, star) {
				unread = append(unread, star)
			}
		}
		if len(unread) > 0 {
			heads, err := c.store.PolicyHeads(ctx, unread)
			if err != nil {
				return fmt.Errorf("heads of %d routes' %q policies: %w", len(unread), ledger.AnySubject, err)
			}
			for _, star := range unread {
				stars[star] = heads[star].Active
			}
		}
		for i := range page {
			key := page[i].Policy.Key
			b.add(&page[i].Policy, page[i].Active, stars[ledger.PolicyKey{Subject: ledger.AnySubject, Route: key.Route, Region: key.Region}])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b.v, nil
}

// policyPage is how many policies a worker's pass reads at a time
// (eachPolicyPage): the drain pass after a change and a new epoch
// leader's first pass hold one page of decoded policies, not every
// policy (about 290 MB at 900,000).
const policyPage = 1000

// eachPolicyPage calls f with the generations newer than after, oldest
// first, a page of at most policyPage at a time (store.Store.PolicyPage:
// each a read of its own, each policy with whether its key's head names
// it active in the same read), and returns the first read's or f's
// error.
func (c *Core) eachPolicyPage(ctx context.Context, after uint64, f func(page []store.ListedPolicy) error) error {
	for {
		page, err := c.store.PolicyPage(ctx, store.PolicyFilter{After: after, Limit: policyPage})
		if err != nil {
			return fmt.Errorf("policies after %d: %w", after, err)
		}
		if err := f(page); err != nil {
			return err
		}
		if len(page) < policyPage {
			return nil
		}
		after = page[len(page)-1].Policy.Generation
	}
}

// drainView returns the view of the policies for a drain pass: known's,
// when it has one and nothing says to read again (DrainPolicies), else
// one from every policy (then kept in known, when not nil).
func (c *Core) drainView(ctx context.Context, known *DrainPolicies, digested bool) (*drainView, error) {
	if known == nil {
		return c.readDrainView(ctx, digested)
	}
	// The count first: a change that commits between the two reads is
	// in the list, and moves the count the next pass reads.
	changes, err := c.store.PolicyChanges(ctx)
	if err != nil {
		return nil, fmt.Errorf("policy changes: %w", err)
	}
	if known.view != nil && changes == known.changes && known.passes < drainFullReadEvery-1 {
		known.passes++
		return known.view, nil
	}
	view, err := c.readDrainView(ctx, true)
	if err != nil {
		return nil, err
	}
	known.view, known.changes, known.passes = view, changes, 0
	return known.view, nil
}

// DrainPager returns a pager over the accounts of superseded or
// rolled-back generations that still hold available capacity or debt
// (late refunds and late overuse land there after a generation switch or a
// rollback): their drain commands, which move it to the subject's current
// account exactly once. The ledger answers ErrNothingToDrain where there
// is nothing to do, so a candidate picked too eagerly costs one no-op.
//
// Which accounts those are follows ledger.DecidingGeneration: every
// account of a generation that is not its key's active one (read page by
// page from the index), and, under an AnySubject generation that is still
// active, the accounts of the subjects that have an active policy of their
// own (one point read each). What decides for the subjects of each page
// is read with it, in one read of their keys' heads (decidingOf). plan,
// when set, says how to read each
// superseded generation (the engine's drain worker: its drainMemo); nil
// reads each in full. Each scan lists the accounts that got a command or
// held reservations (ScanEnd.Waiting), and with plan those that may still
// hold their subject's capacity under a generation that refills
// (mayStayCurrent): when it ran to its end, no other account of the
// generation can need a drain while the active generations stay the same
// (capacity lands on a superseded account only as a late refund or
// overuse of its own reservations, or as the lazy refill a switch leaves
// on the account it moves the subject from).
//
// known, when not nil, keeps what the pass derives from the policies
// (DrainPolicies): a pass after one that read them reads one meta row
// (store.Store.PolicyChanges), not every policy, while none changed.
// Without it every policy is read. It returns the digest of the active
// generations (digestActive), the one plan gets: the drain memo's key
// (the zero digest without plan or known).
func (c *Core) DrainPager(ctx context.Context, pageSize int, plan func(active activeDigest, generation uint64) DrainPlan, known *DrainPolicies) (*Pager, activeDigest, error) {
	view, err := c.drainView(ctx, known, plan != nil)
	if err != nil {
		return nil, activeDigest{}, err
	}
	p := &Pager{core: c, size: max(pageSize, 1), collect: drainWaitingPerGeneration, points: slices.Clone(view.points)}
	for _, g := range view.superseded {
		s := scan{generation: g}
		if plan != nil {
			how := plan(view.digest, g)
			if how.Skip {
				continue
			}
			s.byPoints, s.points = how.ByPoints, how.Points
		}
		p.scans = append(p.scans, s)
	}
	// deciding is what decides for the subjects of the page at hand, read
	// with it: a page's accounts are of superseded generations, or of an
	// active AnySubject one for subjects with a policy of their own, so
	// their subjects are the keys that have something to drain, or those
	// of a route with an AnySubject policy whose own policy the view did
	// not keep.
	var deciding map[ledger.PolicyKey]uint64
	p.prepare = func(ctx context.Context, page []ledger.Account) error {
		read, err := c.decidingOf(ctx, page)
		deciding = read
		return err
	}
	p.make = func(a *ledger.Account) (ledger.Command, bool) {
		deciding, ok := deciding[a.Key.SubjectKey()]
		if !ok || deciding == a.Key.Generation || !holds(a) {
			return ledger.Command{}, false // nothing admits for the subject, it is the one that does, or it is empty
		}
		return ledger.Command{Kind: ledger.KindDrain, Account: a.Key}, true
	}
	if plan != nil {
		// An account that reads empty may still hold its subject's
		// capacity (the subject has not come back since the publish):
		// its refill is lazy, and the switch when the subject comes back
		// refills it under its own rule and leaves there what the
		// deciding burst has no room for, though it held no reservation.
		refills := view.refills
		p.live = view.live
		p.switchable = func(a *ledger.Account) bool {
			deciding, ok := deciding[a.Key.SubjectKey()]
			return ok && deciding != a.Key.Generation && refills[a.Key.Generation]
		}
	}
	return p, view.digest, nil
}

// decidingOf returns the generation that decides for each subject of
// accounts that one decides for (ledger.DecidingGeneration over the heads
// of their keys and of their routes' AnySubject keys, read in one
// store.Store.PolicyHeads read; none for no accounts), as committed when
// read: a drain pass asks it of each page instead of keeping every key's
// active generation between passes. A head newer than the pass's view of
// the policies only makes the pass pick its candidates by what the ledger
// will decide (a drain moves to the generation deciding when it commits);
// the view is read again at the next pass (PolicyChanges moved).
func (c *Core) decidingOf(ctx context.Context, accounts []ledger.Account) (map[ledger.PolicyKey]uint64, error) {
	if len(accounts) == 0 {
		return nil, nil
	}
	keys := make([]ledger.PolicyKey, 0, 2*len(accounts))
	for i := range accounts {
		subject := accounts[i].Key.SubjectKey()
		keys = append(keys, subject, ledger.PolicyKey{Subject: ledger.AnySubject, Route: subject.Route, Region: subject.Region})
	}
	heads, err := c.store.PolicyHeads(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("heads of %d subjects: %w", len(accounts), err)
	}
	active := func(key ledger.PolicyKey) (uint64, bool) {
		h, ok := heads[key]
		return h.Active, ok && h.Active != 0
	}
	out := make(map[ledger.PolicyKey]uint64, len(accounts))
	for i := range accounts {
		subject := accounts[i].Key.SubjectKey()
		if g, ok := ledger.DecidingGeneration(subject, active); ok {
			out[subject] = g
		}
	}
	return out, nil
}

// reserves reports whether an account holds reservations in one of its
// dimensions.
func reserves(a *ledger.Account) bool {
	for d := 0; d < a.Dims; d++ {
		if a.Balances[d].Reserved > 0 {
			return true
		}
	}
	return false
}

// holds reports whether an account holds available capacity or debt in
// one of its dimensions.
func holds(a *ledger.Account) bool {
	for d := 0; d < a.Dims; d++ {
		if a.Balances[d].Available > 0 || a.Balances[d].Debt() > 0 {
			return true
		}
	}
	return false
}

// Next returns the commands of the next page that has any, reading at
// most a few pages without one; no commands and a nil error when the
// pager is done.
func (p *Pager) Next(ctx context.Context) ([]ledger.Command, error) {
	for !p.done {
		if p.cur >= len(p.scans) {
			cmds, err := p.nextPoints(ctx)
			if len(cmds) > 0 || err != nil {
				return cmds, err
			}
			p.done = true
			break
		}
		s := &p.scans[p.cur]
		var page []ledger.Account
		var next store.EpochCursor
		var last bool
		if s.byPoints {
			var err error
			if page, err = p.readPoints(ctx, s); err != nil {
				return nil, err
			}
			last = len(s.points) == 0
		} else {
			var err error
			page, next, err = p.core.store.AccountsByEpoch(ctx, s.filter(p.after, p.size))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s, err)
			}
			last = len(page) < p.size
			if s.keep != nil {
				page = slices.DeleteFunc(page, func(a ledger.Account) bool { return !s.keep(&a) })
			}
		}
		if p.prepare != nil {
			if err := p.prepare(ctx, page); err != nil {
				return nil, fmt.Errorf("%s: %w", s, err)
			}
		}
		var cmds []ledger.Command
		var quiet []*ledger.Account
		for i := range page {
			cmd, ok := p.make(&page[i])
			if ok {
				cmds = append(cmds, cmd)
			}
			held := reserves(&page[i])
			p.holding = p.holding || held
			if ok || held {
				p.list(page[i].Key)
			} else if p.switchable != nil && p.switchable(&page[i]) {
				quiet = append(quiet, &page[i])
			}
		}
		if err := p.mayStayCurrent(ctx, quiet); err != nil {
			return nil, err
		}
		// A page's reads answered: a caller bounding each wait for its
		// store (store.WithProgress; RunDrains under the server's
		// --store-timeout) waits anew for the next page, though this
		// call goes on reading pages that yield no command.
		store.Progressed(ctx)
		p.found += len(cmds)
		if last {
			end := ScanEnd{Generation: s.generation, Commands: p.found, Holds: p.holding, Overflow: p.overflow}
			if p.collect > 0 && !p.overflow {
				end.Waiting = p.waiting
			}
			p.ended = append(p.ended, end)
			p.cur++
			p.after = store.EpochCursor{}
			if p.cur < len(p.scans) {
				p.after = p.scans[p.cur].from
			}
			p.found, p.holding, p.waiting, p.overflow = 0, false, nil, false
		} else {
			p.after = next
		}
		if len(cmds) > 0 {
			return cmds, nil
		}
	}
	return nil, nil
}

// mayStayCurrent lists those of quiet (accounts of a page that got no
// command and hold no reservation, under a generation that refills) that
// may still be their subject's current account, or that something
// landed on since the page was read, and marks the scan holding so that
// the drain memo reads them again: a switch may leave capacity there.
// One read of the subjects' accounts tells: a subject with an account
// under a newer generation that is not rolled back has moved on (a switch
// goes to the deciding generation, and generations only grow, so the
// subject cannot have come back to this one while that one lives).
func (p *Pager) mayStayCurrent(ctx context.Context, quiet []*ledger.Account) error {
	if len(quiet) == 0 {
		return nil
	}
	subjects := make([]ledger.PolicyKey, len(quiet))
	for i, a := range quiet {
		subjects[i] = a.Key.SubjectKey()
	}
	rows, err := p.core.store.AccountsOfSubjects(ctx, subjects)
	if err != nil {
		return fmt.Errorf("accounts of %d subjects: %w", len(subjects), err)
	}
	bySubject := make(map[ledger.PolicyKey][]int, len(quiet))
	for i := range rows {
		subject := rows[i].Key.SubjectKey()
		bySubject[subject] = append(bySubject[subject], i)
	}
	for _, a := range quiet {
		landed, movedOn := false, false
		for _, i := range bySubject[a.Key.SubjectKey()] {
			r := &rows[i]
			switch {
			case r.Key.Generation == a.Key.Generation:
				landed = holds(r) || reserves(r)
			case r.Key.Generation > a.Key.Generation && p.live(r.Key.Generation):
				movedOn = true
			}
		}
		if landed || !movedOn {
			p.holding = true
			p.list(a.Key)
		}
	}
	return nil
}

// readPoints reads up to a page of s's points (those not found are
// left out) and takes them off s.
func (p *Pager) readPoints(ctx context.Context, s *scan) ([]ledger.Account, error) {
	n := min(p.size, len(s.points))
	page, err := p.pointAccounts(ctx, s.points[:n])
	if err != nil {
		return nil, err
	}
	s.points = s.points[n:]
	return page, nil
}

// pointAccounts reads the accounts of keys, one point read each, leaving
// out those not found.
func (p *Pager) pointAccounts(ctx context.Context, keys []ledger.AccountKey) ([]ledger.Account, error) {
	page := make([]ledger.Account, 0, len(keys))
	for _, key := range keys {
		a, err := p.core.store.AccountGet(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("account %s: %w", key, err)
		}
		page = append(page, a)
	}
	return page, nil
}

// list adds key to the current scan's waiting accounts, up to collect
// for the scan and drainMemoPoints for all (what the drain memo keeps at
// most).
func (p *Pager) list(key ledger.AccountKey) {
	if p.collect <= 0 || p.overflow {
		return
	}
	if len(p.waiting) >= p.collect || p.listed >= drainMemoPoints {
		p.listed -= len(p.waiting)
		p.waiting, p.overflow = nil, true
		return
	}
	p.waiting = append(p.waiting, key)
	p.listed++
}

// nextPoints reads the point candidates a page at a time until one gives
// commands or none are left.
func (p *Pager) nextPoints(ctx context.Context) ([]ledger.Command, error) {
	var cmds []ledger.Command
	for len(p.points) > 0 && len(cmds) == 0 {
		n := min(p.size, len(p.points))
		page, err := p.pointAccounts(ctx, p.points[:n])
		if err != nil {
			return nil, err
		}
		p.points = p.points[n:]
		if p.prepare != nil {
			if err := p.prepare(ctx, page); err != nil {
				return nil, fmt.Errorf("point candidates: %w", err)
			}
		}
		for i := range page {
			if cmd, ok := p.make(&page[i]); ok {
				cmds = append(cmds, cmd)
			}
		}
	}
	return cmds, nil
}

// filter returns the store filter of s's page after the cursor after.
func (s *scan) filter(after store.EpochCursor, limit int) store.EpochFilter {
	return store.EpochFilter{Generation: s.generation, AllGenerations: s.across, StartedBy: s.startedBy, After: after, Limit: limit}
}

// String names s's accounts in errors.
func (s *scan) String() string {
	if s.across {
		return "accounts of every generation"
	}
	return fmt.Sprintf("accounts of generation %d", s.generation)
}

// CatchUp runs the store's EpochIndexCatchUp over every range the
// pager's scans read (after the pass's commands committed), a chunk of
// the pager's size at a time, calling each before every chunk (the
// engine's pacing: false stops it). It returns false when each refused, or
// on the first error. The entries of accounts whose busy epoch rolled,
// by the pass's closes or by commands inline, then sit at their epoch:
// the next pass, which starts at the epochs this one read
// (EpochScans), finds them there when that epoch ends.
func (p *Pager) CatchUp(ctx context.Context, each func() bool, done func(time.Duration)) error {
	for _, s := range p.scans {
		f := s.filter(s.from, p.size)
		for {
			if !each() {
				return errors.New("epoch index catch-up stopped")
			}
			started := time.Now()
			next, more, err := p.core.store.EpochIndexCatchUp(ctx, f)
			done(time.Since(started))
			if err != nil {
				return fmt.Errorf("epoch index, %s: %w", &s, err)
			}
			if !more {
				break
			}
			f.After = next
		}
	}
	return nil
}

// ScanEnd is what one generation's scan found, once it ran to its end.
type ScanEnd struct {
	Generation uint64
	// Commands is how many commands the scan produced.
	Commands int
	// Holds is whether one of the accounts it read held reservations
	// (a late refund may land there) or, in a drain pager for the memo,
	// may still hold its subject's capacity (a switch may leave some
	// there: mayStayCurrent).
	Holds bool
	// Waiting are the accounts that got a command, held reservations or
	// may still hold their subject's capacity, when the pager lists them
	// (a drain pager) and they were at most drainWaitingPerGeneration;
	// Overflow says there were more.
	Waiting  []ledger.AccountKey
	Overflow bool
}

// Ended returns the scans that ran to their end so far, in order.
func (p *Pager) Ended() []ScanEnd { return p.ended }

// all drains a pager into one list (for EpochsDue and DrainsDue).
func (p *Pager) all(ctx context.Context) ([]ledger.Command, error) {
	var out []ledger.Command
	for {
		cmds, err := p.Next(ctx)
		if err != nil {
			return nil, err
		}
		if len(cmds) == 0 {
			return out, nil
		}
		out = append(out, cmds...)
	}
}
