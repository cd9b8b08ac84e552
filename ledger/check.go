package ledger

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"time"
)

// Snapshot is a whole ledger's rows, as an audit reads them from any store.
type Snapshot struct {
	// Policies, or PoliciesOf when set: it returns the policies of
	// generations (absent: one that does not exist), read in the
	// snapshot's read, so an audit reads those of a page of accounts at a
	// time (auditPolicyPage), not every policy at once.
	Policies   []Policy
	PoliciesOf func(generations []uint64) (map[uint64]Policy, error)
	// Accounts, or AccountStream when set: it calls yield with every
	// account in key order (AccountKey.Compare; valid only during the
	// call) and may be called more than once, so an audit holds one
	// account at a time, not all of them.
	Accounts      []Account
	AccountStream func(yield func(a *Account) error) error
	// AccountKeyStream, when set, is the accounts' keys alone, as
	// AccountStream would give them: a cut reads the accounts a second
	// time for their keys only (to merge them with its replays once every
	// check has passed), and a store reads a key cheaper than an account.
	AccountKeyStream func(yield func(k *AccountKey) error) error
	// Reservations, or ReservationStream when set: it calls yield with
	// every reservation (valid only during the call), so an audit holds a
	// page of them, not the history. A stream may fill only the fields
	// Audit reads: ID, Account, State, Reserved, Actual and Overdraft.
	Reservations      []Reservation
	ReservationStream func(yield func(r *Reservation) error) error
	Moves             []Move
	Shards            []Shard
	Statements        []Statement
	// Retained holds, per account, what retention removed (Retire): the
	// spent and debt checks add it to the reservations still stored.
	Retained []Retained
	// RetainedShards holds, per account, the shards retention removed
	// (RemoveShards): the shard checks add them to the shards still
	// stored.
	RetainedShards []RetainedShards
	// Checkpoints is the checkpoint chain, oldest first; the last one
	// carries its accounts, the others may be headers. Journal then holds
	// the entries after the last one only.
	Checkpoints []Checkpoint
	// CheckpointAccountStream, when set, is the last checkpoint's accounts
	// instead of its Accounts: it calls yield with each in key order
	// (valid only during the call) and may be called more than once.
	CheckpointAccountStream func(yield func(a *CheckpointAccount) error) error
	Journal                 []JournalEntry
	// ForgetsJournaledAfter is the journal position after which the
	// store journals every forgotten tombstone (a KindForget entry): 0
	// for a store that did from its first entry, the last position
	// written before the upgrade for a store an earlier version wrote,
	// which forgot tombstones silently. The refund_once check accepts a
	// second life of an id only after a forget entry, except after an
	// ending at or before this position, whose forget may be unjournaled.
	ForgetsJournaledAfter int64
	// JournalComplete says Journal holds every entry since the last
	// checkpoint (since the beginning without one), so replay checks apply.
	JournalComplete bool
	// JournalStream, when set, is the journal instead of Journal: it calls
	// yield with every entry in journal order and its position (the entry
	// is valid only during the call) and returns the first error of yield
	// or of its read. Audit then holds one account's replay per account,
	// not the history. Without it, Journal[i] is at position i+1 after the
	// last checkpoint's Through (0 without one).
	JournalStream func(yield func(pos int64, e *JournalEntry) error) error
	// Estimate, when set, estimates how many journal entries and accounts
	// the snapshot holds, plus its reservations when asked: what an
	// audit's progress (AuditOptions.Progress) is measured against.
	Estimate func(reservations bool) (int64, error)
	// TempDir, when set, is where an audit may keep a temporary file (a
	// staged cut: AuditOptions.Stage), on the store's disk.
	TempDir string
	// Release, when set, ends the store's read: AuditWith calls it once it
	// reads nothing more from the streams, before a staged cut emits its
	// accounts, so the store's writes meanwhile do not pile up behind the
	// read (SQLite's WAL). Nothing may be read from the streams after it.
	Release func()
}

// LastCheckpoint returns the newest checkpoint, nil without one.
func (s *Snapshot) LastCheckpoint() *Checkpoint {
	if len(s.Checkpoints) == 0 {
		return nil
	}
	return &s.Checkpoints[len(s.Checkpoints)-1]
}

// forEachJournal calls f with every journal entry of s and its position,
// from JournalStream when set.
func (s *Snapshot) forEachJournal(f func(pos int64, e *JournalEntry)) error {
	if s.JournalStream != nil {
		return s.JournalStream(func(pos int64, e *JournalEntry) error { f(pos, e); return nil })
	}
	var base int64
	if last := s.LastCheckpoint(); last != nil {
		base = last.Through
	}
	for i := range s.Journal {
		f(base+int64(i+1), &s.Journal[i])
	}
	return nil
}

// forEachReservation calls f with every reservation of s, from
// ReservationStream when set.
func (s *Snapshot) forEachReservation(f func(r *Reservation)) error {
	if s.ReservationStream != nil {
		return s.ReservationStream(func(r *Reservation) error { f(r); return nil })
	}
	for i := range s.Reservations {
		f(&s.Reservations[i])
	}
	return nil
}

// Discrepancy is one failed audit check.
type Discrepancy struct {
	Check       string // short name of the rule, e.g. "conservation"
	Account     string
	Reservation string
	Detail      string
}

func (d Discrepancy) String() string {
	s := d.Check
	if d.Account != "" {
		s += " account=" + d.Account
	}
	if d.Reservation != "" {
		s += " reservation=" + d.Reservation
	}
	return s + ": " + d.Detail
}

// Audit names of the checks.
const (
	CheckConservation = "conservation"
	CheckNegative     = "negative_term"
	CheckReserved     = "reserved_vs_holds"
	CheckSpent        = "spent_vs_settled"
	CheckDebt         = "unrecorded_debt"
	CheckJournal      = "journal_replay"
	CheckRefundOnce   = "refund_once"
	CheckMove         = "move_both_ends"
	CheckStatement    = "statement_chain"
	CheckShard        = "shard_conservation"
	CheckBurst        = "above_burst"
)

// CheckAccount returns nil when the account satisfies the conservation
// equation in every dimension and no term is negative.
func CheckAccount(a *Account) error {
	for i := 0; i < a.Dims; i++ {
		if err := checkBalance(&a.Balances[i]); err != nil {
			return fmt.Errorf("%s dimension %d: %w", a.Key, i, err)
		}
	}
	return nil
}

func checkBalance(b *Balance) error {
	if b.Sources() != b.Uses() {
		return fmt.Errorf("opening %d + minted %d + overdraftIssued %d = %d, but available %d + reserved %d + spent %d + retiredForEmergency %d + retiredForMove %d + overdraftRepaid %d = %d",
			b.Opening, b.Minted, b.OverdraftIssued, b.Sources(),
			b.Available, b.Reserved, b.Spent, b.RetiredForEmergency, b.RetiredForMove, b.OverdraftRepaid, b.Uses())
	}
	terms := [...]Units{b.Opening, b.Minted, b.OverdraftIssued, b.Available, b.Reserved, b.Spent,
		b.RetiredForEmergency, b.RetiredForMove, b.OverdraftRepaid}
	for _, t := range terms {
		if t < 0 {
			return fmt.Errorf("negative term in %+v", *b)
		}
	}
	if b.OverdraftRepaid > b.OverdraftIssued {
		return fmt.Errorf("repaid %d more than issued %d", b.OverdraftRepaid, b.OverdraftIssued)
	}
	return nil
}

// Audit checks a whole ledger and returns every discrepancy (none when the
// ledger is sound):
//   - every account's conservation equation, per dimension, and no negative
//     term;
//   - no account holds more than its generation's burst (available +
//     reserved): refill, refunds and moves all stop at it;
//   - each account's Reserved equals the holds of its RESERVED, STARTED,
//     EXPIRING and USAGE_UNKNOWN reservations (unknown usage is never
//     counted as unconsumed);
//   - each account's Spent equals the actual usage of its settled
//     reservations, and its OverdraftIssued covers their overdraft (no
//     unrecorded debt), counting those retention removed (Retained);
//   - each shard account's RetiredForEmergency equals its shards' allocation,
//     and each reconciled shard splits its allocation exactly;
//   - with a complete journal: replaying it gives every account's balances,
//     no reservation was refunded twice (each life of an id, reused after
//     its tombstone was forgotten, ends once), no id was admitted again
//     after it ended without a forget entry between (its tombstone still
//     answered for it), every move is journaled once at both ends, and
//     what left its source arrived at its destination, in each unit
//     (moveConservation);
//   - statements chain: each epoch opens with the previous closing;
//   - the checkpoint chain verifies (VerifyCheckpoints), and the journal
//     since the last checkpoint replays from its closing vectors.
func Audit(s *Snapshot) []Discrepancy {
	out, _ := AuditWith(s, AuditOptions{})
	return out
}

// SkippedSinceCheckpoint reports whether check is one a SinceCheckpoint
// audit does not run (reserved vs holds, spent vs settled, unrecorded
// debt: they read every reservation), so that its clean result says
// nothing about it.
func SkippedSinceCheckpoint(check string) bool {
	return check == CheckReserved || check == CheckSpent || check == CheckDebt
}

// AuditOptions choose what AuditWith checks and whether it cuts a
// checkpoint.
type AuditOptions struct {
	// SinceCheckpoint skips the checks that read every reservation
	// (reserved vs holds, spent vs settled, unrecorded debt): what is left
	// reads the accounts and the journal since the last checkpoint, so it
	// costs what happened since, not the history.
	SinceCheckpoint bool
	// Cut, when positive, asks for the next checkpoint, summarising the
	// journal up to position Cut, cut at CutAt. It needs a complete
	// journal; it is returned only when the audit found nothing.
	Cut   int64
	CutAt time.Time
	// Emit, when set, takes the cut checkpoint's accounts in key order,
	// one at a time (valid only during the call), and the checkpoint
	// returned has none (its digests cover them): memory is then bounded
	// by the accounts touched since the last checkpoint, not by all of
	// them. Emit is called only once every check has passed; when it
	// returns an error, no checkpoint is returned and the caller has the
	// error.
	Emit func(a *CheckpointAccount) error
	// Stage, when set with Emit, keeps the cut checkpoint's accounts from
	// the audit's one pass over the accounts, which makes them as it
	// checks them, to Emit: the accounts are read once, not twice, the
	// replays are let go before the first Emit, and Snapshot.Release ends
	// the store's read then. A refused cut leaves the stage to the caller
	// to discard. When Put or Each fails, no checkpoint is returned and
	// the caller has the error (as with Emit's).
	Stage CheckpointStage
	// Progress, when set, is called now and then with the reservations,
	// journal entries and accounts read so far.
	Progress func(rows int64)
}

// CheckpointStage holds a cut checkpoint's accounts, in key order,
// between the pass that makes them and their emission (AuditOptions.Stage).
type CheckpointStage interface {
	// Put appends an account (valid only during the call).
	Put(a *CheckpointAccount) error
	// Each calls yield with every account put, in order (each valid only
	// during its call), and returns the first error of yield or its own.
	Each(yield func(a *CheckpointAccount) error) error
}

// progressEvery is how many rows an audit reads between Progress calls.
const progressEvery = 1 << 14

// AuditWith is Audit with options: every discrepancy, and the checkpoint
// asked for by o.Cut when the ledger is sound.
func AuditWith(s *Snapshot, o AuditOptions) ([]Discrepancy, *Checkpoint) {
	var out []Discrepancy
	var rows int64
	tick := func() {
		if rows++; o.Progress != nil && rows%progressEvery == 0 {
			o.Progress(rows)
		}
	}
	add := func(check string, account AccountKey, reservation, format string, args ...any) {
		acc := ""
		if account != (AccountKey{}) {
			acc = account.String()
		}
		out = append(out, Discrepancy{Check: check, Account: acc, Reservation: reservation, Detail: fmt.Sprintf(format, args...)})
	}

	per := map[AccountKey]*sums{}
	get := func(k AccountKey) *sums {
		t := per[k]
		if t == nil {
			t = &sums{}
			per[k] = t
		}
		return t
	}
	readErr := func(what string, err error) {
		if err != nil {
			add(CheckJournal, AccountKey{}, "", "%s could not be read whole: %v", what, err)
		}
	}
	forEachReservation := s.forEachReservation
	if o.SinceCheckpoint {
		forEachReservation = func(func(*Reservation)) error { return nil }
	}
	// A stream's reservations in id order often name the account of the
	// one before (a store keeps its strings then): no hashing for those.
	var (
		prevKey  AccountKey
		prevSums *sums
	)
	readErr("reservations", forEachReservation(func(r *Reservation) {
		tick()
		if prevSums == nil || r.Account != prevKey {
			prevKey, prevSums = r.Account, get(r.Account)
		}
		t := prevSums
		for d := range r.Reserved {
			switch {
			case r.State.Holds():
				t.held[d] += r.Reserved[d]
			case r.State == StateSettled || r.State == StateSettledWithDebt:
				t.spent[d] += r.Actual[d]
				t.overdraft[d] += r.Overdraft[d]
			}
		}
		if r.State == StateSettledWithDebt && r.Overdraft == (Amounts{}) {
			add(CheckDebt, r.Account, r.ID, "SETTLED_WITH_DEBT without overdraft")
		}
	}))
	for i := range s.Retained {
		rt := &s.Retained[i]
		t := get(rt.Account)
		for d := range rt.Spent {
			t.spent[d] += rt.Spent[d]
			t.overdraft[d] += rt.Overdraft[d]
		}
	}
	for i := range s.Shards {
		sh := &s.Shards[i]
		t := get(sh.Account)
		for d := range sh.Allocated {
			t.shards[d] += sh.Allocated[d]
		}
		if sh.Reconciled {
			for d := range sh.Allocated {
				if sh.Spent[d]+sh.Unknown[d]+sh.Reminted[d] != sh.Allocated[d] || sh.Spent[d] < 0 || sh.Unknown[d] < 0 || sh.Reminted[d] < 0 {
					add(CheckShard, sh.Account, "", "shard %s %s: allocated %d != spent %d + unknown %d + reminted %d",
						sh.ID, dimensionName(snapshotPolicy(s, sh.Account.Generation), d), sh.Allocated[d], sh.Spent[d], sh.Unknown[d], sh.Reminted[d])
				}
			}
		}
	}
	for i := range s.RetainedShards {
		rs := &s.RetainedShards[i]
		t := get(rs.Account)
		for d := range rs.Allocated {
			t.shards[d] += rs.Allocated[d]
			if rs.Spent[d]+rs.Reminted[d] != rs.Allocated[d] || rs.Spent[d] < 0 || rs.Reminted[d] < 0 {
				add(CheckShard, rs.Account, "", "%d removed shards %s: allocated %d != spent %d + reminted %d",
					rs.Shards, dimensionName(snapshotPolicy(s, rs.Account.Generation), d), rs.Allocated[d], rs.Spent[d], rs.Reminted[d])
			}
		}
	}
	var policies map[uint64]*Policy
	if s.PoliciesOf == nil {
		policies = make(map[uint64]*Policy, len(s.Policies))
		for i := range s.Policies {
			policies[s.Policies[i].Generation] = &s.Policies[i]
		}
	}
	byAccount := map[AccountKey][]Statement{}
	for _, st := range s.Statements {
		byAccount[st.Account] = append(byAccount[st.Account], st)
	}
	for _, list := range byAccount {
		slices.SortFunc(list, func(a, b Statement) int { return a.EpochStart.Compare(b.EpochStart) })
	}

	// The journal first: what an account's replay adds to the last
	// checkpoint's closing vector, for the accounts with entries since
	// (replays); then one pass over the accounts merged in key order with
	// the last checkpoint's (auditAccounts), so neither is held whole.
	last := s.LastCheckpoint()
	var builder *checkpointBuilder
	if o.Cut > 0 && s.JournalComplete {
		builder = newCheckpointBuilder(last, o.Cut, s.Moves)
	}
	ids := newAccountIDs()
	var (
		replays   *replaySet
		touched   int64
		twice     []endedTwice
		twiceAt   map[idKey]int // twice's index of a life ended twice so far
		refunds   map[idKey]life
		reborn    []rebornID
		receipts  moveEnds
		journalRd error
	)
	if s.JournalComplete {
		replays = newReplaySet()
		// Endings are counted by the first 128 bits of the SHA-256 of the
		// reservation id, a fixed size smaller than most ids over a long
		// journal, deterministic, and not open to ids crafted to collide
		// (two ids of one key would be reported as one ended twice).
		refunds, twiceAt = map[idKey]life{}, map[idKey]int{}
		receipts = newMoveEnds(s.Moves)
		cache := newIDCache()
		journalRd = s.forEachJournal(func(pos int64, e *JournalEntry) {
			tick()
			if last != nil && pos <= last.Through {
				return // summarised by the checkpoint (a store that has not compacted yet)
			}
			id := cache.of(ids, e.Account)
			r := replays.getOrAdd(id)
			replays.add(r, &e.Delta, builder != nil && pos > builder.through)
			if builder != nil {
				if r.entries == 0 && pos <= builder.through {
					touched++
				}
				builder.add(pos, e, r)
			}
			if begins, ends := e.Begins(), e.Ends(); begins || ends || e.Forgets() {
				// Endings are counted per life of the id. A life ends
				// for good at its forget entry (retention forgot its
				// tombstone: the id may be reused), which closes its
				// count. An admission after an ending with no forget
				// entry between re-admitted the id while its tombstone
				// (or its row) still answered for it: reported, unless
				// that ending is older than the store's forget entries
				// (ForgetsJournaledAfter), when it is taken for a reuse
				// as before them. Either way it begins a new count. An
				// admission while the id has not ended stays in its
				// life, so a doubly admitted id's endings add up.
				h := keyOf(e.ReservationID)
				l := refunds[h]
				if e.Forgets() || begins && l.ends > 0 {
					if begins && l.journaled {
						reborn = append(reborn, rebornID{id: e.ReservationID, at: pos})
					}
					if l.ends >= 2 {
						delete(twiceAt, h)
					}
					delete(refunds, h)
					l = life{}
				}
				if ends {
					l.ends++
					l.journaled = pos > s.ForgetsJournaledAfter
					refunds[h] = l
					switch {
					case l.ends == 2:
						twiceAt[h] = len(twice)
						twice = append(twice, endedTwice{id: e.ReservationID, times: l.ends})
					case l.ends > 2:
						twice[twiceAt[h]].times = l.ends
					}
				}
			}
			receipts.note(e)
		})
	}

	pass := s.auditAccounts(auditPass{o: o, policies: policies, per: func(k AccountKey) *sums { return per[k] },
		statements: byAccount, replays: replays, builder: builder, ids: ids, touched: touched, tick: tick,
		rereadKeys: func(missing map[accountID]bool) []AccountKey {
			var keys []AccountKey
			_ = s.forEachJournal(func(pos int64, e *JournalEntry) {
				if id := ids.of(e.Account); missing[id] && (last == nil || pos > last.Through) && pos <= builder.through {
					delete(missing, id)
					keys = append(keys, e.Account)
				}
			})
			return keys
		}})
	out = append(out, pass.accountOut...)
	readErr("accounts", pass.accountsRead)
	readErr("policies", pass.policiesRead)
	out = append(out, verifyCheckpointHeaders(s.Checkpoints)...)
	out = append(out, pass.checkpointOut...)
	if s.JournalComplete {
		readErr("journal", journalRd)
		out = append(out, pass.replayOut...)
		for _, tw := range twice {
			add(CheckRefundOnce, AccountKey{}, tw.id, "ended %d times", tw.times)
		}
		for _, rb := range reborn {
			add(CheckRefundOnce, AccountKey{}, rb.id, "admitted again at journal position %d after it ended, with no forget entry between: "+
				"its tombstone (or its row) still answered for the id", rb.at)
		}
		// A move's entries are written in one batch, so either the last
		// checkpoint summarised both ends (it counts such moves) or the
		// journal since holds them.
		var summarised int64
		for i := range s.Moves {
			m := &s.Moves[i]
			seen := receipts.seen(m.ReceiptID)
			if seen == nil && last != nil {
				summarised++
				continue
			}
			if seen == nil {
				seen = &moveSeen{}
			}
			// A remint is journaled at its source only when it charges
			// debt there; one whose source is its destination counts as
			// the destination's.
			switch {
			case m.Kind != MoveShardRemint && seen.from == 0:
				add(CheckMove, m.From, "", "move %s not journaled at its source", m.ReceiptID)
			case seen.from > 1:
				add(CheckMove, m.From, "", "move %s journaled %d times at its source", m.ReceiptID, seen.from)
			}
			switch {
			case seen.to == 0:
				add(CheckMove, m.To, "", "move %s not journaled at its destination", m.ReceiptID)
			case seen.to > 1:
				add(CheckMove, m.To, "", "move %s journaled %d times at its destination", m.ReceiptID, seen.to)
			}
		}
		if last != nil && summarised != last.Moves {
			add(CheckMove, AccountKey{}, "", "%d moves are not in the journal since checkpoint %d, which summarises %d",
				summarised, last.Seq, last.Moves)
		}
		// What left each move's source arrived at its destination, in
		// each unit, when the journal since the last checkpoint holds
		// the move (moveConservation).
		found, err := s.auditMoveAmounts(receipts, policies)
		out = append(out, found...)
		readErr("policies", err)
	}
	if o.Progress != nil {
		o.Progress(rows)
	}

	out = append(out, auditShards(s)...)

	for key, list := range byAccount {
		for i, st := range list {
			for d := 0; d < st.Dims; d++ {
				if err := checkBalance(&st.Closing[d]); err != nil {
					add(CheckStatement, key, "", "epoch %s closing: %v", st.EpochStart.Format("2006-01-02T15:04Z"), err)
				}
			}
			if i > 0 && (list[i-1].Closing != st.Opening || !list[i-1].EpochEnd.Equal(st.EpochStart)) {
				add(CheckStatement, key, "", "epoch %s does not open where %s closed", st.EpochStart, list[i-1].EpochStart)
			}
		}
	}
	out = append(out, pass.statementOut...)
	if builder == nil || len(out) > 0 {
		return out, nil
	}
	if pass.staged {
		// Everything is read and checked: the accounts of the cut are in
		// the stage but for the extra keys'; let the replays and the
		// store's read go before writing.
		extra := make([]CheckpointAccount, 0, len(pass.extra))
		for _, k := range pass.extra {
			if a, ok := builder.nextAccount(k, nil, replays, replays.get(ids.of(k))); ok {
				extra = append(extra, a)
			}
		}
		replays, pass.replays, refunds, receipts = nil, nil, nil, moveEnds{}
		if s.Release != nil {
			s.Release()
		}
		cp, found := pass.emitStaged(builder, extra, o)
		return append(out, found...), cp
	}
	cp, found := s.cutCheckpoint(builder, replays, pass, o)
	return append(out, found...), cp
}

// endedTwice is a life of a reservation id that ended more than once.
type endedTwice struct {
	id    string
	times int32
}

// life is the refund-once check's count of the latest life of an id:
// how often it ended so far, and whether its last ending is one whose
// forget, if its tombstone was forgotten, is journaled (after
// Snapshot.ForgetsJournaledAfter).
type life struct {
	ends      int32
	journaled bool
}

// rebornID is an id admitted again after it ended, with no forget entry
// between, at journal position at.
type rebornID struct {
	id string
	at int64
}

// sums are what an audit adds up per account from the reservations, what
// retention removed and the shards.
type sums struct{ held, spent, overdraft, shards Amounts }

// idKey is the refund-once check's key of a reservation id.
type idKey [16]byte

func keyOf(id string) idKey {
	sum := sha256.Sum256([]byte(id))
	return idKey(sum[:16])
}

// Step check names.
const (
	CheckStepReplay     = "step_replay"
	CheckStepAdmission  = "step_admission"
	CheckStepTransition = "step_transition"
	CheckStepRefund     = "step_refund"
	CheckStepMonotone   = "step_monotone"
	CheckStepMove       = "step_move"
	CheckStepPolicy     = "step_policy"
)

// legalTransition reports whether one command may move a reservation from
// one state to another: the seed's lifecycle, and nothing else (in
// particular never STARTED -> EXPIRED, and never out of a terminal state).
func legalTransition(kind Kind, from, to State) bool {
	switch kind {
	case KindStart:
		return from == StateReserved && to == StateStarted
	case KindSettle:
		return (from == StateStarted || from == StateUsageUnknown) && (to == StateSettled || to == StateSettledWithDebt)
	case KindRelease:
		return from == StateReserved && to == StateReleased
	case KindExpireClaim:
		return from == StateReserved && to == StateExpiring
	case KindExpire:
		return from == StateExpiring && to == StateExpired
	case KindMarkUsageUnknown:
		return from == StateStarted && to == StateUsageUnknown
	}
	return false
}

// checkUnknownAt says what is wrong with how one legal transition from old
// to r treated UnknownAt, or "": only STARTED -> USAGE_UNKNOWN sets it, to
// the time of that step (its journal entry's, when after holds it), and
// nothing else changes it, so the backlog's age is the marking's.
func checkUnknownAt(old, r *Reservation, after *Snapshot) string {
	marked := old.State == StateStarted && r.State == StateUsageUnknown
	switch {
	case !marked && !r.UnknownAt.Equal(old.UnknownAt):
		return fmt.Sprintf("unknown-at changed from %s to %s by %s -> %s", old.UnknownAt, r.UnknownAt, old.State, r.State)
	case !marked:
		return ""
	case !old.UnknownAt.IsZero() || r.UnknownAt.IsZero():
		return fmt.Sprintf("marked unknown with unknown-at %s (was %s)", r.UnknownAt, old.UnknownAt)
	}
	for i := len(after.Journal) - 1; i >= 0; i-- {
		if e := &after.Journal[i]; e.ReservationID == r.ID && e.From == StateStarted && e.To == StateUsageUnknown {
			if !e.At.Equal(r.UnknownAt) {
				return fmt.Sprintf("marked unknown at %s, journaled at %s", r.UnknownAt, e.At)
			}
			break
		}
	}
	return ""
}

// CheckStep checks one command's transition: before and after are the
// ledger's rows just before and just after cmd was applied, res is what it
// answered. It returns every discrepancy (none when the step is sound):
//   - a replay changed nothing and refunded nothing;
//   - a reservation appears only through a successful, non-replayed reserve
//     of exactly the command's id and units, on an account without debt,
//     while no other account of its subject owes any either (no admission
//     while debt is outstanding, across generations), and no account's Reserved
//     grows otherwise; or through a successful, non-replayed record of the
//     command's id, holding nothing, settled with exactly its usage and
//     operation (debt does not stop a record);
//   - a reservation changes only by a legal transition of the command's
//     kind on the command's id, only on success, and a terminal one never
//     changes; UnknownAt is set only by STARTED -> USAGE_UNKNOWN, to that
//     step's time, and is never changed after;
//   - Refunded is exactly what the ending of the reservation gave back
//     (reserved minus actual on settle, the whole hold on release or
//     expiry), and zero for anything else, so nothing is refunded twice;
//   - cumulative terms (opening, minted, overdraft issued and repaid,
//     spent, retired) never decrease, Spent grows only by a settle's or a
//     record's actual usage, and no account disappears;
//   - a move receipt, once written, never changes;
//   - a published generation's terms never change, and a rollback is never
//     undone.
func CheckStep(before, after *Snapshot, cmd *Command, res *Result) []Discrepancy {
	var out []Discrepancy
	add := func(check string, account AccountKey, reservation, format string, args ...any) {
		acc := ""
		if account != (AccountKey{}) {
			acc = account.String()
		}
		out = append(out, Discrepancy{Check: check, Account: acc, Reservation: reservation, Detail: fmt.Sprintf(format, args...)})
	}

	accountsBefore := make(map[AccountKey]*Account, len(before.Accounts))
	for i := range before.Accounts {
		accountsBefore[before.Accounts[i].Key] = &before.Accounts[i]
	}
	accountsAfter := make(map[AccountKey]*Account, len(after.Accounts))
	for i := range after.Accounts {
		accountsAfter[after.Accounts[i].Key] = &after.Accounts[i]
	}
	reservationsBefore := make(map[string]*Reservation, len(before.Reservations))
	for i := range before.Reservations {
		reservationsBefore[before.Reservations[i].ID] = &before.Reservations[i]
	}

	if res.Replayed && res.Refunded != (Amounts{}) {
		add(CheckStepReplay, AccountKey{}, cmd.ReservationID, "replay refunded %v", res.Refunded)
	}

	// Reservations: what appeared, what changed, what the refund was.
	var refundWant Amounts
	reservedGrowth := map[AccountKey]Amounts{}
	spentGrowth := map[AccountKey]Amounts{}
	for i := range after.Reservations {
		r := &after.Reservations[i]
		old, existed := reservationsBefore[r.ID]
		if !existed {
			switch {
			case (cmd.Kind != KindReserve && cmd.Kind != KindRecord) || res.Err != nil || res.Replayed || r.ID != cmd.ReservationID:
				add(CheckStepAdmission, r.Account, r.ID, "appeared on %s (err %v, replayed %v)", cmd.Kind, res.Err, res.Replayed)
			case cmd.Kind == KindRecord:
				// A record holds nothing and is born settled with the
				// command's usage; it may charge a frozen account.
				if (r.State != StateSettled && r.State != StateSettledWithDebt) || r.Reserved != (Amounts{}) || r.Actual != cmd.Units ||
					r.OperationID != cmd.OperationID || !r.UnknownAt.IsZero() {
					add(CheckStepAdmission, r.Account, r.ID, "recorded as %s holding %v using %v, asked to record %v", r.State, r.Reserved, r.Actual, cmd.Units)
				}
				spentGrowth[r.Account] = r.Actual
				if accountsAfter[r.Account] == nil {
					add(CheckStepAdmission, r.Account, r.ID, "recorded on a missing account")
				}
				continue
			case r.State != StateReserved || r.Reserved != cmd.Units:
				add(CheckStepAdmission, r.Account, r.ID, "admitted as %s holding %v, asked %v", r.State, r.Reserved, cmd.Units)
			case !r.UnknownAt.IsZero():
				add(CheckStepAdmission, r.Account, r.ID, "admitted already marked unknown at %s", r.UnknownAt)
			}
			if a := accountsAfter[r.Account]; a == nil {
				add(CheckStepAdmission, r.Account, r.ID, "admitted on a missing account")
			} else if dim, debt := a.Debt(); dim >= 0 {
				add(CheckStepAdmission, r.Account, r.ID, "admitted while dimension %d owes %d", dim, debt)
			}
			// Nor while another generation's account of the subject owes
			// (debt in a unit the deciding generation does not limit).
			for k, other := range accountsAfter {
				if k != r.Account && k.SubjectKey() == r.Account.SubjectKey() {
					if dim, debt := other.Debt(); dim >= 0 {
						add(CheckStepAdmission, r.Account, r.ID, "admitted while %s dimension %d owes %d", k, dim, debt)
					}
				}
			}
			g := reservedGrowth[r.Account]
			for d := range g {
				g[d] += r.Reserved[d]
			}
			reservedGrowth[r.Account] = g
			continue
		}
		if *old == *r {
			continue
		}
		switch {
		case old.State.Terminal():
			add(CheckStepTransition, r.Account, r.ID, "terminal %s changed to %s", old.State, r.State)
		case res.Err != nil || res.Replayed:
			add(CheckStepTransition, r.Account, r.ID, "changed %s -> %s on a %s that answered err %v, replayed %v",
				old.State, r.State, cmd.Kind, res.Err, res.Replayed)
		case r.ID != cmd.ReservationID:
			add(CheckStepTransition, r.Account, r.ID, "changed %s -> %s by a %s of %q", old.State, r.State, cmd.Kind, cmd.ReservationID)
		case !legalTransition(cmd.Kind, old.State, r.State):
			add(CheckStepTransition, r.Account, r.ID, "illegal %s -> %s by %s", old.State, r.State, cmd.Kind)
		case old.Reserved != r.Reserved || old.Account != r.Account || old.RequestDigest != r.RequestDigest:
			add(CheckStepTransition, r.Account, r.ID, "identity or hold changed by %s", cmd.Kind)
		default:
			if d := checkUnknownAt(old, r, after); d != "" {
				add(CheckStepTransition, r.Account, r.ID, "%s", d)
			}
		}
		if r.State.Terminal() {
			refundWant = r.Refund()
		}
		if r.State == StateSettled || r.State == StateSettledWithDebt {
			spentGrowth[r.Account] = r.Actual
		}
	}
	reservationsAfter := make(map[string]bool, len(after.Reservations))
	for i := range after.Reservations {
		reservationsAfter[after.Reservations[i].ID] = true
	}
	for id := range reservationsBefore {
		retired := cmd.Kind == KindRetire && id == cmd.ReservationID && res.Err == nil && !res.Replayed &&
			reservationsBefore[id].State.Terminal()
		if !reservationsAfter[id] && !retired {
			add(CheckStepTransition, AccountKey{}, id, "reservation disappeared on %s", cmd.Kind)
		}
	}
	if res.Refunded != refundWant {
		add(CheckStepRefund, AccountKey{}, cmd.ReservationID, "%s answered refunded %v, the transition gave back %v",
			cmd.Kind, res.Refunded, refundWant)
	}

	// Accounts: cumulative terms, and Reserved/Spent growth only by the
	// command's own reservation.
	for key, old := range accountsBefore {
		a := accountsAfter[key]
		if a == nil {
			add(CheckStepMonotone, key, "", "account disappeared on %s", cmd.Kind)
			continue
		}
		if res.Replayed && a.Balances != old.Balances {
			add(CheckStepReplay, key, cmd.ReservationID, "replayed %s changed balances", cmd.Kind)
		}
		if a.Dims != old.Dims {
			add(CheckStepMonotone, key, "", "dimensions changed from %d to %d", old.Dims, a.Dims)
		}
		for d := 0; d < MaxDimensions; d++ {
			x, y := &old.Balances[d], &a.Balances[d]
			if y.Opening < x.Opening || y.Minted < x.Minted || y.OverdraftIssued < x.OverdraftIssued ||
				y.Spent < x.Spent || y.RetiredForEmergency < x.RetiredForEmergency ||
				y.RetiredForMove < x.RetiredForMove || y.OverdraftRepaid < x.OverdraftRepaid {
				add(CheckStepMonotone, key, "", "dimension %d: a cumulative term decreased on %s: %+v -> %+v", d, cmd.Kind, *x, *y)
			}
			if grown := y.Reserved - x.Reserved; grown > 0 && grown != reservedGrowth[key][d] {
				add(CheckStepAdmission, key, "", "dimension %d: reserved grew by %d on %s, admissions account for %d",
					d, grown, cmd.Kind, reservedGrowth[key][d])
			}
			if grown := y.Spent - x.Spent; grown != spentGrowth[key][d] {
				add(CheckStepMonotone, key, "", "dimension %d: spent grew by %d on %s, settled usage accounts for %d",
					d, grown, cmd.Kind, spentGrowth[key][d])
			}
		}
	}
	for key, a := range accountsAfter {
		if accountsBefore[key] != nil {
			continue
		}
		for d := 0; d < MaxDimensions; d++ {
			if a.Balances[d].Reserved != reservedGrowth[key][d] {
				add(CheckStepAdmission, key, "", "dimension %d: new account reserves %d, admissions account for %d",
					d, a.Balances[d].Reserved, reservedGrowth[key][d])
			}
			if a.Balances[d].Spent != spentGrowth[key][d] {
				add(CheckStepMonotone, key, "", "dimension %d: new account spent %d, settled usage accounts for %d",
					d, a.Balances[d].Spent, spentGrowth[key][d])
			}
		}
	}

	movesBefore := make(map[string]*Move, len(before.Moves))
	for i := range before.Moves {
		movesBefore[before.Moves[i].ReceiptID] = &before.Moves[i]
	}
	seen := make(map[string]bool, len(after.Moves))
	for i := range after.Moves {
		m := &after.Moves[i]
		if seen[m.ReceiptID] {
			add(CheckStepMove, m.To, "", "receipt %s written twice", m.ReceiptID)
		}
		seen[m.ReceiptID] = true
		if old := movesBefore[m.ReceiptID]; old != nil && *old != *m {
			add(CheckStepMove, m.To, "", "receipt %s changed on %s", m.ReceiptID, cmd.Kind)
		}
	}
	for id := range movesBefore {
		if !seen[id] {
			add(CheckStepMove, AccountKey{}, "", "receipt %s disappeared on %s", id, cmd.Kind)
		}
	}

	policiesAfter := make(map[uint64]*Policy, len(after.Policies))
	for i := range after.Policies {
		policiesAfter[after.Policies[i].Generation] = &after.Policies[i]
	}
	for i := range before.Policies {
		old := &before.Policies[i]
		p := policiesAfter[old.Generation]
		switch {
		case p == nil:
			add(CheckStepPolicy, AccountKey{}, "", "generation %d disappeared", old.Generation)
		case !sameTerms(old, p) || !old.PublishedAt.Equal(p.PublishedAt):
			add(CheckStepPolicy, AccountKey{}, "", "generation %d changed its terms on %s", old.Generation, cmd.Kind)
		case old.RolledBack && !p.RolledBack:
			add(CheckStepPolicy, AccountKey{}, "", "rollback of generation %d undone", old.Generation)
		}
	}
	return out
}
