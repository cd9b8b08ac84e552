package ledger_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/capledger/capledger/ledger"
)

// storeBook behaves like a store transaction: every getter returns a fresh
// copy of the row, and only a Put makes a change visible. Running commands
// against it proves the ledger hands back every row it changes; against
// Memory (which returns its own pointers) a forgotten Put goes unnoticed.
type storeBook struct{ m *ledger.Memory }

func newStoreBook() *storeBook { return &storeBook{m: ledger.NewMemory()} }

func (s *storeBook) Meta(name string) int64           { return s.m.Meta(name) }
func (s *storeBook) MetaPut(name string, value int64) { s.m.MetaPut(name, value) }
func (s *storeBook) Policy(g uint64) (*ledger.Policy, bool) {
	p, ok := s.m.Policy(g)
	if !ok {
		return nil, false
	}
	c := *p
	c.Dimensions = slices.Clone(p.Dimensions)
	return &c, true
}
func (s *storeBook) PolicyPut(p *ledger.Policy) {
	c := *p
	c.Dimensions = slices.Clone(p.Dimensions)
	s.m.PolicyPut(&c)
}
func (s *storeBook) PolicyHead(k ledger.PolicyKey) (*ledger.PolicyHead, bool) {
	h, ok := s.m.PolicyHead(k)
	if !ok {
		return nil, false
	}
	c := *h
	return &c, true
}
func (s *storeBook) PolicyHeadPut(h *ledger.PolicyHead) { c := *h; s.m.PolicyHeadPut(&c) }
func (s *storeBook) Account(k ledger.AccountKey) (*ledger.Account, bool) {
	a, ok := s.m.Account(k)
	if !ok {
		return nil, false
	}
	c := *a
	return &c, true
}
func (s *storeBook) AccountPut(a *ledger.Account) { c := *a; s.m.AccountPut(&c) }
func (s *storeBook) AccountCurrent(k ledger.PolicyKey) (uint64, bool) {
	return s.m.AccountCurrent(k)
}
func (s *storeBook) AccountCurrentPut(k ledger.PolicyKey, g uint64) { s.m.AccountCurrentPut(k, g) }
func (s *storeBook) Reservation(id string) (*ledger.Reservation, bool) {
	r, ok := s.m.Reservation(id)
	if !ok {
		return nil, false
	}
	c := *r
	return &c, true
}
func (s *storeBook) ReservationPut(r *ledger.Reservation) { c := *r; s.m.ReservationPut(&c) }
func (s *storeBook) Move(id string) (*ledger.Move, bool) {
	mv, ok := s.m.Move(id)
	if !ok {
		return nil, false
	}
	c := *mv
	return &c, true
}
func (s *storeBook) MovePut(mv *ledger.Move) { c := *mv; s.m.MovePut(&c) }
func (s *storeBook) Shard(id string) (*ledger.Shard, bool) {
	sh, ok := s.m.Shard(id)
	if !ok {
		return nil, false
	}
	c := *sh
	c.Signature = slices.Clone(sh.Signature)
	return &c, true
}
func (s *storeBook) ShardPut(sh *ledger.Shard) {
	c := *sh
	c.Signature = slices.Clone(sh.Signature)
	s.m.ShardPut(&c)
}
func (s *storeBook) StatementPut(st ledger.Statement)    { s.m.StatementPut(st) }
func (s *storeBook) JournalAppend(e ledger.JournalEntry) { s.m.JournalAppend(e) }

// failer is what the harness needs of a test: *testing.T, *testing.B and
// *rapid.T all have it.
type failer interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
}

// checked applies commands to a book and, after each one, runs the whole
// ledger audit and the transition check against the state before it. Every
// test that drives the ledger goes through it, so each command of each test
// is checked for conservation, refund-once, admission-under-debt and legal
// transitions.
type checked struct {
	t    failer
	m    *ledger.Memory
	book ledger.Book
	now  time.Time
	prev *ledger.Snapshot
}

// newChecked returns a harness over a store-like book (copy on read), so
// the tests also prove every changed row is put back.
func newChecked(t failer) *checked {
	sb := newStoreBook()
	return &checked{t: t, m: sb.m, book: sb, now: t0, prev: sb.m.Snapshot()}
}

func (c *checked) advance(d time.Duration) { c.now = c.now.Add(d) }

// apply runs cmd at the harness's time, checks the step and returns the
// result.
func (c *checked) apply(cmd ledger.Command) ledger.Result {
	c.t.Helper()
	res := ledger.Apply(c.book, &cmd, c.now)
	after := c.m.Snapshot()
	for _, d := range ledger.Audit(after) {
		c.t.Fatalf("after %s %q: audit: %s", cmd.Kind, cmd.ReservationID, d)
	}
	for _, d := range ledger.CheckStep(c.prev, after, &cmd, &res) {
		c.t.Fatalf("after %s %q: step: %s", cmd.Kind, cmd.ReservationID, d)
	}
	if problem := heldElsewhereProblem(c.m); problem != "" {
		c.t.Fatalf("after %s %q: %s", cmd.Kind, cmd.ReservationID, problem)
	}
	c.prev = after
	return res
}

// heldElsewhereProblem checks Account.HeldElsewhere, which the audit cannot
// (its snapshot holds no current pointer): every subject's current account
// counts, in each unit its policy limits, what the subject's other
// accounts hold reserved there (at most that in a unit left behind, whose
// holds before the gap are not known), and no other account counts
// anything. It returns the first problem, "" when there is none.
func heldElsewhereProblem(m *ledger.Memory) string {
	bySubject := map[ledger.PolicyKey][]*ledger.Account{}
	for _, a := range m.Accounts() {
		bySubject[a.Key.SubjectKey()] = append(bySubject[a.Key.SubjectKey()], a)
	}
	for subject, accounts := range bySubject {
		g, hasCurrent := m.AccountCurrent(subject)
		var current *ledger.Account
		for _, a := range accounts {
			if hasCurrent && a.Key.Generation == g {
				current = a
			} else if a.HeldElsewhere != (ledger.Amounts{}) {
				return fmt.Sprintf("%s is not current but counts %v held elsewhere", a.Key, a.HeldElsewhere)
			}
		}
		cp, ok := m.Policy(g)
		if current == nil || !ok {
			continue
		}
		// What a store's migration sets (ledger.HeldElsewhereOf) is what
		// the ledger carried, but in a unit left behind, where it carried
		// at most that.
		var others []ledger.Holding
		for _, a := range accounts {
			if ap, ok := m.Policy(a.Key.Generation); ok && a != current {
				others = append(others, ledger.Holding{Account: a, Policy: ap})
			}
		}
		all := ledger.HeldElsewhereOf(current, cp, others)
		for j, d := range cp.Dimensions {
			held := all[j]
			got := current.HeldElsewhere[j]
			if got != held && (got > held || m.Meta(ledger.MetaLeftBehind(subject, d.Unit)) == 0) {
				return fmt.Sprintf("current %s counts %d %s held elsewhere; the subject's other accounts hold %d", current.Key, got, d.Unit, held)
			}
		}
	}
	return ""
}

// publishEdited publishes the test subject's policy with dim, edited from
// generation from (Command.Generation; 0: no precondition), and returns
// the ledger's answer as it is.
func (c *checked) publishEdited(dim ledger.Dimension, from uint64) ledger.Result {
	return c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policyOf(dim), Generation: from})
}

func (c *checked) publish(p *ledger.Policy) uint64 {
	c.t.Helper()
	res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
	if res.Err != nil {
		c.t.Fatalf("publish: %v", res.Err)
	}
	return res.Generation
}

func (c *checked) rollback(key ledger.PolicyKey, generation uint64) ledger.Result {
	c.t.Helper()
	return c.apply(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: generation})
}

func (c *checked) reserve(id string, units ...ledger.Units) ledger.Result {
	c.t.Helper()
	var amounts ledger.Amounts
	copy(amounts[:], units)
	return c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: amounts})
}

func (c *checked) start(id string) ledger.Result {
	c.t.Helper()
	return c.apply(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
}

func (c *checked) settle(id string, units ...ledger.Units) ledger.Result {
	c.t.Helper()
	var amounts ledger.Amounts
	copy(amounts[:], units)
	return c.apply(ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: amounts})
}

// must fails the test unless res succeeded.
func (c *checked) must(res ledger.Result) ledger.Result {
	c.t.Helper()
	if res.Err != nil {
		c.t.Fatalf("unexpected error: %v", res.Err)
	}
	return res
}

func (c *checked) account(generation uint64) *ledger.Account {
	c.t.Helper()
	a, ok := c.m.Account(ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route,
		Region: testSubject.Region, Generation: generation})
	if !ok {
		c.t.Fatalf("no account for generation %d", generation)
	}
	return a
}

// testSubject is the subject and the policy key of the helpers.
var testSubject = ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}

// policyOf returns a policy for testSubject with the given dimensions.
func policyOf(dims ...ledger.Dimension) *ledger.Policy {
	p := ledger.Policy{Key: testSubject, Dimensions: dims, HoldTTL: 30 * time.Second}.WithDefaults()
	return &p
}

// tokens is a dimension of burst units refilling refill per second.
func tokens(burst, refill ledger.Units) ledger.Dimension {
	return ledger.Dimension{Unit: "tokens", Burst: burst, RefillUnits: refill, RefillInterval: time.Second, MaxOverdraft: burst / 2}
}

// storeBook keeps tombstones like a store: copies in and out.
func (s *storeBook) Tombstone(id string) (*ledger.Tombstone, bool) {
	t, ok := s.m.Tombstone(id)
	if !ok {
		return nil, false
	}
	c := *t
	return &c, true
}
func (s *storeBook) TombstonePut(t *ledger.Tombstone) { c := *t; s.m.TombstonePut(&c) }
func (s *storeBook) TombstoneRemove(id string)        { s.m.TombstoneRemove(id) }
func (s *storeBook) ReservationRemove(id string)      { s.m.ReservationRemove(id) }
func (s *storeBook) Retained(k ledger.AccountKey) (*ledger.Retained, bool) {
	r, ok := s.m.Retained(k)
	if !ok {
		return nil, false
	}
	c := *r
	return &c, true
}
func (s *storeBook) RetainedPut(r *ledger.Retained) { c := *r; s.m.RetainedPut(&c) }
