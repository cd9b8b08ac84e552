package ledger

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/maphash"
	"iter"
	"slices"
)

// An audit holds the ledger's accounts and the last checkpoint's accounts
// one at a time: it reads both in key order (Snapshot.AccountStream and
// CheckpointAccountStream, or the slices) and merges them, and a cut
// checkpoint's accounts go out one at a time too (AuditOptions.Emit).
// What it holds for the whole audit is one replay per account with
// journal entries since the last checkpoint.

// replay is one account's journal since the last checkpoint, as an audit
// holds it: the entries' deltas summed, and for a cut, what the
// checkpoint builder needs. It is kept small (120 bytes) and free of
// pointers, and keyed by accountID rather than by the key's strings,
// because an audit holds one per account with entries since the last
// checkpoint: a million of them when a million tenants moved in an epoch
// (replaySet).
type replay struct {
	dim0    Balance // the sum of the entries' first dimension
	more    int32   // 1 + the index of the rest in replaySet.more; 0 while the entries touch no other dimension and none is beyond the cut
	entries int64   // entries up to the cut
	chain   [sha256.Size]byte
}

// replayMore is the rest of a replay that most accounts do not need.
type replayMore struct {
	rest   [MaxDimensions - 1]Balance // the other dimensions
	beyond Balances                   // of the entries summed, those after the cut
}

// replaySet holds an audit's replays by account without a pointer the
// garbage collector must follow: the index maps an accountID to a
// position, and the replays sit in chunks (slab). A map of a
// million pointers to a million small objects, as before, was most of
// what the collector marked during a cut, and serve collects often then:
// beside the expiry of a million holds, the heap sits at its soft limit
// (docs/PERFORMANCE.md, "RSS and the checkpoint cut").
type replaySet struct {
	index map[accountID]int32
	all   slab[replay]
	more  slab[replayMore]
}

func newReplaySet() *replaySet { return &replaySet{index: map[accountID]int32{}} }

// get returns id's replay, nil when it has none (or rs is nil).
func (rs *replaySet) get(id accountID) *replay {
	if rs == nil {
		return nil
	}
	i, ok := rs.index[id]
	if !ok {
		return nil
	}
	return rs.all.at(i)
}

// getOrAdd returns id's replay, a new empty one when it had none.
func (rs *replaySet) getOrAdd(id accountID) *replay {
	if r := rs.get(id); r != nil {
		return r
	}
	i, r := rs.all.add()
	rs.index[id] = i
	return r
}

// add sums delta into r; beyond says the entry is after the cut.
func (rs *replaySet) add(r *replay, d *Balances, beyond bool) {
	for i := 1; i < len(d); i++ {
		if d[i] != (Balance{}) && r.more == 0 {
			r.more = rs.newMore()
		}
	}
	r.dim0.add(&d[0])
	if r.more != 0 {
		m := rs.more.at(r.more - 1)
		for i := 1; i < len(d); i++ {
			m.rest[i-1].add(&d[i])
		}
	}
	if beyond {
		if r.more == 0 {
			r.more = rs.newMore()
		}
		rs.more.at(r.more - 1).beyond.Add(d)
	}
}

func (rs *replaySet) newMore() int32 {
	i, _ := rs.more.add()
	return i + 1
}

// addTo adds to b what r sums, and with cut leaves out what is beyond the
// cut.
func (rs *replaySet) addTo(r *replay, b *Balances, cut bool) {
	b[0].add(&r.dim0)
	if r.more == 0 {
		return
	}
	m := rs.more.at(r.more - 1)
	for i := range m.rest {
		b[i+1].add(&m.rest[i])
	}
	if cut {
		for i := range m.beyond {
			x := &m.beyond[i]
			neg := Balance{Opening: -x.Opening, Minted: -x.Minted, OverdraftIssued: -x.OverdraftIssued,
				Available: -x.Available, Reserved: -x.Reserved, Spent: -x.Spent,
				RetiredForEmergency: -x.RetiredForEmergency, RetiredForMove: -x.RetiredForMove,
				OverdraftRepaid: -x.OverdraftRepaid}
			b[i].add(&neg)
		}
	}
}

// slabChunk is how many values one chunk of a slab holds.
const slabChunk = 1 << 12

// slab holds values in chunks of slabChunk, so that a million of them
// are a few hundred objects and a growing slice never copies them all.
// The first chunk starts small and grows like a slice (most audits are
// small), so a pointer from add or at is valid until the next add.
type slab[T any] struct {
	chunks [][]T
	n      int32
}

// add returns a new zero value and its index.
func (s *slab[T]) add() (int32, *T) {
	i := s.n
	switch {
	case len(s.chunks) == 0:
		s.chunks = append(s.chunks, make([]T, 0, 16))
	case len(s.chunks[len(s.chunks)-1]) == slabChunk:
		s.chunks = append(s.chunks, make([]T, 0, slabChunk))
	}
	last := &s.chunks[len(s.chunks)-1]
	var zero T
	*last = append(*last, zero)
	s.n++
	return i, &(*last)[len(*last)-1]
}

// at returns the value at index i.
func (s *slab[T]) at(i int32) *T { return &s.chunks[i/slabChunk][i%slabChunk] }

// accountID names an account in an audit's replays: the first 128 bits of
// the SHA-256 of its key's canonical encoding, 16 bytes instead of a key's
// three strings, and not open to keys crafted to collide.
type accountID [16]byte

// accountIDs computes accountIDs over one reused buffer.
type accountIDs struct {
	buf []byte
}

func newAccountIDs() *accountIDs { return &accountIDs{buf: make([]byte, 0, 128)} }

func (ids *accountIDs) of(k AccountKey) accountID {
	ids.buf = appendKey(ids.buf[:0], k)
	sum := sha256.Sum256(ids.buf)
	return accountID(sum[:16])
}

// idCacheSize is how many keys an idCache remembers.
const idCacheSize = 1024

// idCache remembers the accountIDs of the keys seen last, one per slot of
// a hash of the key (the slot's key is compared whole, so an id is always
// its key's): the journal names the same accounts again and again, and
// hashing a key with maphash is a small part of hashing it with SHA-256.
// It holds at most idCacheSize keys' strings.
type idCache struct {
	seed  maphash.Seed
	slots [idCacheSize]struct {
		key AccountKey
		id  accountID
		set bool
	}
}

func newIDCache() *idCache { return &idCache{seed: maphash.MakeSeed()} }

// of returns ids.of(k), from the cache when k is there.
func (c *idCache) of(ids *accountIDs, k AccountKey) accountID {
	e := &c.slots[maphash.Comparable(c.seed, k)%idCacheSize]
	if !e.set || e.key != k {
		e.key, e.id, e.set = k, ids.of(k), true
	}
	return e.id
}

// eachAccount calls f with every account of s in key order, from
// AccountStream when set.
func (s *Snapshot) eachAccount(f func(*Account) error) error {
	if s.AccountStream != nil {
		return s.AccountStream(f)
	}
	accounts := s.Accounts
	if !slices.IsSortedFunc(accounts, func(a, b Account) int { return a.Key.Compare(b.Key) }) {
		accounts = slices.SortedFunc(slices.Values(accounts), func(a, b Account) int { return a.Key.Compare(b.Key) })
	}
	for i := range accounts {
		if err := f(&accounts[i]); err != nil {
			return err
		}
	}
	return nil
}

// eachAccountKey calls f with every account key of s in key order, from
// AccountKeyStream when set.
func (s *Snapshot) eachAccountKey(f func(*AccountKey) error) error {
	if s.AccountKeyStream != nil {
		return s.AccountKeyStream(f)
	}
	return s.eachAccount(func(a *Account) error { return f(&a.Key) })
}

// eachCheckpointAccount calls f with every account of the last checkpoint
// in the order they are stored (key order), from CheckpointAccountStream
// when set; nothing without a checkpoint.
func (s *Snapshot) eachCheckpointAccount(f func(*CheckpointAccount) error) error {
	last := s.LastCheckpoint()
	switch {
	case last == nil:
		return nil
	case s.CheckpointAccountStream != nil:
		return s.CheckpointAccountStream(f)
	}
	for i := range last.Accounts {
		if err := f(&last.Accounts[i]); err != nil {
			return err
		}
	}
	return nil
}

// hasCheckpointAccounts reports whether the last checkpoint's accounts
// are to be verified: VerifyCheckpoints skips a header without accounts
// that summarises nothing.
func (s *Snapshot) hasCheckpointAccounts() bool {
	last := s.LastCheckpoint()
	return last != nil && (s.CheckpointAccountStream != nil || last.Accounts != nil || last.Entries != 0)
}

// ErrStopped is what an audit's yield returns to a stream it no longer
// reads (a merge that ended early): not a read error.
var ErrStopped = errors.New("ledger: stream stopped")

// puller reads a push stream one item at a time (iter.Pull): the item is
// valid until the next call of next, and a key that does not follow the
// one before is an error of the stream.
type puller[T any] struct {
	next    func() (*T, bool)
	stop    func()
	key     func(*T) AccountKey
	cur     *T
	err     error // the stream's own error
	order   error // the first key out of order
	last    AccountKey
	started bool
}

func pull[T any](stream func(yield func(*T) error) error, key func(*T) AccountKey) *puller[T] {
	p := &puller[T]{key: key}
	p.next, p.stop = iter.Pull(func(yield func(*T) bool) {
		err := stream(func(t *T) error {
			if !yield(t) {
				return ErrStopped
			}
			return nil
		})
		if err != nil && !errors.Is(err, ErrStopped) {
			p.err = err
		}
	})
	p.advance()
	return p
}

// advance moves to the next item; p.cur is nil at the end.
func (p *puller[T]) advance() {
	t, ok := p.next()
	if !ok {
		p.cur = nil
		return
	}
	k := p.key(t)
	if p.started && p.last.Compare(k) >= 0 && p.order == nil {
		p.order = fmt.Errorf("%s read after %s: not in key order", k, p.last)
	}
	p.started, p.last, p.cur = true, k, t
}

// merge calls f with every key of the ledger's accounts, the last
// checkpoint's accounts and the extra keys (sorted), in key order, with
// the account and the checkpoint account of that key (nil where there is
// none), and returns the streams' errors: the accounts' first, then the
// checkpoint's (orderErr: a stream out of key order).
func (s *Snapshot) merge(extra []AccountKey, f func(k AccountKey, a *Account, p *CheckpointAccount)) (accountsErr, checkpointErr error) {
	return mergeStreams(s.eachAccount, func(a *Account) AccountKey { return a.Key }, s.eachCheckpointAccount, extra, f)
}

// mergeKeys is merge over the accounts' keys alone (eachAccountKey): f
// gets the key for a, or nil where there is no account of the key.
func (s *Snapshot) mergeKeys(extra []AccountKey, f func(k AccountKey, a *AccountKey, p *CheckpointAccount)) (accountsErr, checkpointErr error) {
	return mergeStreams(s.eachAccountKey, func(k *AccountKey) AccountKey { return *k }, s.eachCheckpointAccount, extra, f)
}

func mergeStreams[A any](accounts func(func(*A) error) error, key func(*A) AccountKey, checkpoint func(func(*CheckpointAccount) error) error,
	extra []AccountKey, f func(k AccountKey, a *A, p *CheckpointAccount)) (accountsErr, checkpointErr error) {
	as := pull(accounts, key)
	defer as.stop()
	ps := pull(checkpoint, func(a *CheckpointAccount) AccountKey { return a.Account })
	defer ps.stop()
	for as.cur != nil || ps.cur != nil || len(extra) > 0 {
		var k AccountKey
		have := false
		pick := func(c AccountKey) {
			if !have || c.Compare(k) < 0 {
				k, have = c, true
			}
		}
		if as.cur != nil {
			pick(key(as.cur))
		}
		if ps.cur != nil {
			pick(ps.cur.Account)
		}
		if len(extra) > 0 {
			pick(extra[0])
		}
		var a *A
		var p *CheckpointAccount
		if as.cur != nil && key(as.cur) == k {
			a = as.cur
		}
		if ps.cur != nil && ps.cur.Account == k {
			p = ps.cur
		}
		if len(extra) > 0 && extra[0] == k {
			extra = extra[1:]
		}
		f(k, a, p)
		if a != nil {
			as.advance()
		}
		if p != nil {
			ps.advance()
		}
	}
	return errors.Join(as.err, as.order), errors.Join(ps.err, ps.order)
}

// auditPass is what one pass over the accounts checks and finds.
type auditPass struct {
	o AuditOptions
	// policies are the snapshot's Policies by generation; nil when it
	// reads them by PoliciesOf, a page of accounts' at a time (bursts).
	policies   map[uint64]*Policy
	per        func(AccountKey) *sums
	statements map[AccountKey][]Statement
	replays    *replaySet // nil without a complete journal
	builder    *checkpointBuilder
	ids        *accountIDs
	// touched counts the replays with entries within the cut; rereadKeys
	// reads the keys of the given ones again from the journal.
	touched    int64
	rereadKeys func(ids map[accountID]bool) []AccountKey
	// tick counts one row read towards the audit's progress
	// (AuditOptions.Progress): the pass counts each account.
	tick func()

	// Found, in the order Audit reports them: the account checks, the
	// last checkpoint's accounts, the replays, the current epochs against
	// their statements.
	accountOut, checkpointOut, replayOut, statementOut []Discrepancy
	accountsRead, policiesRead                         error
	// bursts are the accounts whose burst check waits for their
	// policies (Snapshot.PoliciesOf), at most auditPolicyPage.
	bursts []pendingBurst
	// cutAccounts counts the accounts of the checkpoint to cut; extra are
	// the keys with entries within the cut that are neither accounts nor
	// in the last checkpoint, in key order.
	cutAccounts int64
	extra       []AccountKey
	// staged says the pass put the cut's accounts into o.Stage (all of
	// them but the extra keys', in key order); stageErr is the stage's
	// first error (the pass then puts no more).
	staged   bool
	stageErr error
	next     CheckpointAccount // the account staged, reused (Put takes it by pointer)
}

// auditPolicyPage is how many accounts' burst checks wait for one read of
// their policies (Snapshot.PoliciesOf): an audit holds at most that many
// policies, not every one (a policy per tenant: a million).
const auditPolicyPage = 256

// pendingBurst is an account whose burst check waits for its policy:
// what the check reads, and where in accountOut its findings go (after
// the account's conservation findings, before what follows them).
type pendingBurst struct {
	key  AccountKey
	at   int
	dims int
	held [MaxDimensions]Units
}

// checkBursts reads the policies of the accounts in ps.bursts in one
// read and runs their burst checks, each finding in its account's place.
// A failed read is kept in policiesRead (an audit that could not read
// the policies finds that, and cuts nothing).
func (ps *auditPass) checkBursts(s *Snapshot) {
	if len(ps.bursts) == 0 {
		return
	}
	defer func() { ps.bursts = ps.bursts[:0] }()
	if ps.policiesRead != nil {
		return
	}
	generations := make([]uint64, 0, len(ps.bursts))
	for i := range ps.bursts {
		if g := ps.bursts[i].key.Generation; len(generations) == 0 || generations[len(generations)-1] != g {
			generations = append(generations, g)
		}
	}
	found, err := s.PoliciesOf(generations)
	if err != nil {
		ps.policiesRead = err
		return
	}
	var out []Discrepancy
	next := 0 // accountOut up to next is in out
	for i := range ps.bursts {
		b := &ps.bursts[i]
		pol, ok := found[b.key.Generation]
		if !ok {
			continue
		}
		for d := 0; d < b.dims && d < len(pol.Dimensions); d++ {
			if b.held[d] > pol.Dimensions[d].Burst {
				if out == nil {
					out = make([]Discrepancy, 0, len(ps.accountOut)+1)
				}
				out = append(out, ps.accountOut[next:b.at]...)
				next = b.at
				out = append(out, Discrepancy{Check: CheckBurst, Account: b.key.String(),
					Detail: fmt.Sprintf("dimension %d: available + reserved = %d above the burst %d", d, b.held[d], pol.Dimensions[d].Burst)})
			}
		}
	}
	if out != nil {
		ps.accountOut = append(out, ps.accountOut[next:]...)
	}
}

// noSums is what an account without reservations, retained totals or
// shards sums to (read only).
var noSums sums

// auditAccounts runs the checks of one account at a time: the ledger's
// accounts merged with the last checkpoint's, in key order.
func (s *Snapshot) auditAccounts(pass auditPass) *auditPass {
	ps := &pass
	ps.staged = ps.builder != nil && ps.o.Stage != nil && ps.o.Emit != nil
	add := func(out *[]Discrepancy, check string, account AccountKey, format string, args ...any) {
		*out = append(*out, Discrepancy{Check: check, Account: account.String(), Detail: fmt.Sprintf(format, args...)})
	}
	var verify *checkpointVerifier
	var met int64 // replays with entries within the cut met by the merge
	last := s.LastCheckpoint()
	if s.hasCheckpointAccounts() {
		verify = newCheckpointVerifier(last)
	}
	accountsErr, checkpointErr := s.merge(nil, func(k AccountKey, a *Account, p *CheckpointAccount) {
		var r *replay
		// No key has a replay when none has (a compacted journal): then
		// no account's key is hashed.
		if ps.replays != nil && len(ps.replays.index) > 0 {
			r = ps.replays.get(ps.ids.of(k))
			if r != nil && r.entries > 0 {
				met++
			}
		}
		if p != nil && verify != nil {
			verify.account(p)
		}
		if ps.builder != nil && (p != nil || r != nil && r.entries > 0) {
			ps.cutAccounts++
			if ps.staged && ps.stageErr == nil {
				var ok bool
				if ps.next, ok = ps.builder.nextAccount(k, p, ps.replays, r); ok {
					ps.stageErr = ps.o.Stage.Put(&ps.next)
				}
			}
		}
		if a == nil {
			return
		}
		ps.tick()
		for d := 0; d < a.Dims; d++ {
			if err := checkBalance(&a.Balances[d]); err != nil {
				add(&ps.accountOut, CheckConservation, a.Key, "dimension %d: %v", d, err)
			}
		}
		if ps.policies != nil {
			if pol := ps.policies[a.Key.Generation]; pol != nil {
				for d := 0; d < a.Dims && d < len(pol.Dimensions); d++ {
					if held := a.Balances[d].Available + a.Balances[d].Reserved; held > pol.Dimensions[d].Burst {
						add(&ps.accountOut, CheckBurst, a.Key, "dimension %d: available + reserved = %d above the burst %d",
							d, held, pol.Dimensions[d].Burst)
					}
				}
			}
		} else if s.PoliciesOf != nil {
			b := pendingBurst{key: a.Key, at: len(ps.accountOut), dims: a.Dims}
			for d := 0; d < a.Dims; d++ {
				b.held[d] = a.Balances[d].Available + a.Balances[d].Reserved
			}
			if ps.bursts = append(ps.bursts, b); len(ps.bursts) == auditPolicyPage {
				ps.checkBursts(s)
			}
		}
		// Read, not get: an entry per account would hold a million
		// zero sums for the whole audit.
		t := ps.per(a.Key)
		if t == nil {
			t = &noSums
		}
		for d := 0; d < MaxDimensions; d++ {
			bal := &a.Balances[d]
			if bal.RetiredForEmergency != t.shards[d] {
				add(&ps.accountOut, CheckShard, a.Key, "dimension %d: retiredForEmergency %d, shards allocated %d", d, bal.RetiredForEmergency, t.shards[d])
			}
			if ps.o.SinceCheckpoint {
				continue
			}
			if bal.Reserved != t.held[d] {
				add(&ps.accountOut, CheckReserved, a.Key, "dimension %d: reserved %d, holds %d", d, bal.Reserved, t.held[d])
			}
			if bal.Spent != t.spent[d] {
				add(&ps.accountOut, CheckSpent, a.Key, "dimension %d: spent %d, settled actual usage %d", d, bal.Spent, t.spent[d])
			}
			if bal.OverdraftIssued < t.overdraft[d] {
				add(&ps.accountOut, CheckDebt, a.Key, "dimension %d: overdraft issued %d < settled overdraft %d", d, bal.OverdraftIssued, t.overdraft[d])
			}
		}
		if ps.replays != nil {
			// An account with no entry since the last checkpoint replays
			// to its closing vector there (zero without one).
			var got Balances
			if p != nil {
				got = p.Balances
			}
			if r != nil {
				ps.replays.addTo(r, &got, false)
			}
			if got != a.Balances {
				add(&ps.replayOut, CheckJournal, a.Key, "journal replays to %+v, account holds %+v", got[:a.Dims], a.Balances[:a.Dims])
			}
		}
		if list := ps.statements[k]; len(list) > 0 {
			st := &list[len(list)-1]
			if st.Closing != a.EpochOpening || !st.EpochEnd.Equal(a.EpochStart) {
				add(&ps.statementOut, CheckStatement, k, "current epoch %s does not open where %s closed", a.EpochStart, st.EpochStart)
			}
		}
	})
	ps.checkBursts(s)
	if accountsErr != nil {
		ps.accountsRead = accountsErr
	}
	if verify != nil {
		if checkpointErr != nil {
			verify.add(AccountKey{}, "checkpoint %d: accounts could not be read whole: %v", last.Seq, checkpointErr)
		}
		ps.checkpointOut = verify.finish(s.eachCheckpointAccount)
	}
	if ps.builder != nil && met < ps.touched {
		// Entries of accounts that are neither in the ledger nor in the
		// last checkpoint (a store that lost an account row): they are in
		// the checkpoint too, under keys read again from the journal.
		seen := map[accountID]bool{}
		_, _ = s.mergeKeys(nil, func(k AccountKey, _ *AccountKey, _ *CheckpointAccount) { seen[ps.ids.of(k)] = true })
		missing := map[accountID]bool{}
		for id, i := range ps.replays.index {
			if ps.replays.all.at(i).entries > 0 && !seen[id] {
				missing[id] = true
			}
		}
		ps.extra = ps.rereadKeys(missing)
		slices.SortFunc(ps.extra, AccountKey.Compare)
		ps.cutAccounts += int64(len(ps.extra))
	}
	return ps
}

// emitStaged emits the checkpoint an audit that found nothing cuts from
// its stage merged with extra (the extra keys' accounts, in key order),
// folding its accounts digest as they go, as cutCheckpoint does from a
// second pass. It returns the checkpoint, or nil when the stage or Emit
// failed (the caller has the error) or the count is not the pass's.
func (ps *auditPass) emitStaged(b *checkpointBuilder, extra []CheckpointAccount, o AuditOptions) (*Checkpoint, []Discrepancy) {
	if ps.stageErr != nil {
		return nil, nil
	}
	c := b.header(o.CutAt)
	d := newAccountsDigester(ps.cutAccounts)
	var n int64
	emit := func(a *CheckpointAccount) error {
		n++
		d.add(a)
		return o.Emit(a)
	}
	err := o.Stage.Each(func(a *CheckpointAccount) error {
		for len(extra) > 0 && extra[0].Account.Compare(a.Account) < 0 {
			if err := emit(&extra[0]); err != nil {
				return err
			}
			extra = extra[1:]
		}
		return emit(a)
	})
	for ; err == nil && len(extra) > 0; extra = extra[1:] {
		err = emit(&extra[0])
	}
	switch {
	case err != nil:
		return nil, nil
	case n != ps.cutAccounts:
		return nil, []Discrepancy{{Check: CheckCheckpoint, Detail: fmt.Sprintf("checkpoint %d: %d accounts, then %d staged",
			c.Seq, ps.cutAccounts, n)}}
	}
	c.AccountsDigest = d.sum()
	c.Digest = headerDigest(c)
	return c, nil
}

// cutCheckpoint builds the checkpoint an audit that found nothing cuts:
// its accounts merged once more in key order, each handed to o.Emit as it
// is made (or kept in the checkpoint without Emit), its accounts digest
// folded as they go. It returns the checkpoint, or nil and what went
// wrong when a read failed, the accounts changed between the two reads,
// or Emit failed (then the caller has Emit's error).
func (s *Snapshot) cutCheckpoint(b *checkpointBuilder, replays *replaySet, pass *auditPass, o AuditOptions) (*Checkpoint, []Discrepancy) {
	c := b.header(o.CutAt)
	d := newAccountsDigester(pass.cutAccounts)
	if o.Emit == nil {
		c.Accounts = make([]CheckpointAccount, 0, pass.cutAccounts)
	}
	var n int64
	var emitErr error
	accountsErr, checkpointErr := s.mergeKeys(pass.extra, func(k AccountKey, _ *AccountKey, p *CheckpointAccount) {
		if emitErr != nil {
			return
		}
		a, ok := b.nextAccount(k, p, replays, replays.get(pass.ids.of(k)))
		if !ok {
			return
		}
		n++
		d.add(&a)
		if o.Emit == nil {
			c.Accounts = append(c.Accounts, a)
		} else {
			emitErr = o.Emit(&a)
		}
	})
	switch {
	case emitErr != nil:
		return nil, nil
	case accountsErr != nil || checkpointErr != nil:
		return nil, []Discrepancy{{Check: CheckCheckpoint, Detail: fmt.Sprintf("checkpoint %d: accounts could not be read again: %v",
			c.Seq, errors.Join(accountsErr, checkpointErr))}}
	case n != pass.cutAccounts:
		return nil, []Discrepancy{{Check: CheckCheckpoint, Detail: fmt.Sprintf("checkpoint %d: %d accounts, then %d read again",
			c.Seq, pass.cutAccounts, n)}}
	}
	c.AccountsDigest = d.sum()
	c.Digest = headerDigest(c)
	return c, nil
}
