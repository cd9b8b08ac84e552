package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"time"
)

// Statement checkpoints: what lets a store delete the journal.
//
// A checkpoint summarises the journal up to a position: per account, the
// closing vector of every conservation term (what replaying the account's
// entries up to there gives) and a digest of those entries; for the whole
// ledger, how many entries and how many moves it summarises. It is cut by
// an audit (AuditWith with a Cut) that found the ledger sound. The engine
// cuts one per epoch length, after the epoch closes, so an account with no
// entry since its statement closes in the checkpoint with the statement's
// closing vector (nothing here depends on that). Once
// stored, the journal entries it summarises may be deleted: an audit then
// replays the journal since the last checkpoint starting from the
// checkpoint's vectors, and verifies the checkpoints' own chain
// (VerifyCheckpoints) instead of entries that no longer exist.
//
// A journal position is the store's: an increasing number per stored
// journal entry (or per stored batch of entries), which the store hands
// to the audit with every entry (Snapshot.JournalStream). The ledger only
// compares positions.

// Checkpoint is one link of the checkpoint chain.
type Checkpoint struct {
	// Seq numbers the chain: 1 for the first checkpoint, then one more
	// per checkpoint.
	Seq int64
	// Through is the journal position summarised up to, inclusive.
	Through int64
	// CutAt is when the checkpoint was cut.
	CutAt time.Time
	// Entries and Moves count the journal entries and the move receipts
	// summarised since the beginning (this checkpoint and all before it).
	Entries int64
	Moves   int64
	// Prev is the previous checkpoint's Digest, empty for the first.
	Prev string
	// AccountsDigest is the digest of Accounts; Digest the digest of the
	// whole checkpoint, AccountsDigest included. Both are hex SHA-256.
	AccountsDigest string
	Digest         string
	// Accounts, in key order, one per account with journal entries. A
	// store may keep them for the latest checkpoints only: a chain of
	// headers (Accounts nil) is still verifiable through AccountsDigest.
	Accounts []CheckpointAccount
}

// CheckpointAccount is one account's part of a checkpoint.
type CheckpointAccount struct {
	Account AccountKey
	// Balances is the closing vector: the replay of the account's journal
	// entries up to the checkpoint.
	Balances Balances
	// Entries counts the account's entries summarised since the beginning;
	// Journal is the hex SHA-256 chain of them: the digest of the previous
	// checkpoint's Journal followed, when the account has entries since, by
	// the link of the last of them, where a link is the SHA-256 of the
	// link before (32 zero bytes before the first) followed by the
	// encoding of the entry.
	Entries int64
	Journal string
}

// CheckCheckpoint names the audit check of the checkpoint chain.
const CheckCheckpoint = "checkpoint_chain"

// The digests are SHA-256 over a canonical encoding, built by the
// append functions below into a buffer the caller reuses, and hashed in
// one call (sha256.Sum256) or written to a running hash once per account:
// writing each field through hash.Hash copied every string it was given
// (an allocation per field, 1.3 GB over a cut of a million accounts).

// digestHex is the hex form of a hash's sum.
func digestHex(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

func appendVarString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendInt(b []byte, v int64) []byte { return binary.BigEndian.AppendUint64(b, uint64(v)) }

func appendKey(b []byte, k AccountKey) []byte {
	b = appendVarString(b, k.Subject)
	b = appendVarString(b, k.Route)
	b = appendVarString(b, k.Region)
	return appendInt(b, int64(k.Generation))
}

func appendBalances(b []byte, bs *Balances) []byte {
	for i := range bs {
		x := &bs[i]
		for _, v := range [...]Units{x.Opening, x.Minted, x.OverdraftIssued, x.Available, x.Reserved, x.Spent,
			x.RetiredForEmergency, x.RetiredForMove, x.OverdraftRepaid} {
			b = appendInt(b, v)
		}
	}
	return b
}

// appendEntry appends the canonical encoding of a journal entry: every
// field, so the digest changes with any of them.
func appendEntry(b []byte, e *JournalEntry) []byte {
	at := int64(0)
	if !e.At.IsZero() {
		at = e.At.UnixNano()
	}
	b = appendInt(b, at)
	b = appendInt(b, int64(e.Kind))
	b = appendKey(b, e.Account)
	b = appendVarString(b, e.ReservationID)
	b = appendInt(b, int64(e.From)<<8|int64(e.To))
	b = appendVarString(b, e.ReceiptID)
	return appendBalances(b, &e.Delta)
}

// appendAccount appends one account of a checkpoint as its accounts
// digest takes it.
func appendAccount(b []byte, a *CheckpointAccount) []byte {
	b = appendKey(b, a.Account)
	b = appendBalances(b, &a.Balances)
	b = appendInt(b, a.Entries)
	return appendVarString(b, a.Journal)
}

func writeString(h hash.Hash, s string) { h.Write(appendVarString(nil, s)) }

func writeInt(h hash.Hash, v int64) {
	var n [8]byte
	h.Write(appendInt(n[:0], v))
}

func writeEntry(h hash.Hash, e *JournalEntry) { h.Write(appendEntry(nil, e)) }

// accountsDigester folds a checkpoint's accounts, in key order, into its
// accounts digest: their count first, then each account.
type accountsDigester struct {
	h   hash.Hash
	buf []byte
}

func newAccountsDigester(count int64) *accountsDigester {
	d := &accountsDigester{h: sha256.New(), buf: make([]byte, 0, 512)}
	writeInt(d.h, count)
	return d
}

func (d *accountsDigester) add(a *CheckpointAccount) {
	d.buf = appendAccount(d.buf[:0], a)
	d.h.Write(d.buf)
}

func (d *accountsDigester) sum() string { return digestHex(d.h) }

// accountsDigest is the digest of a checkpoint's accounts.
func accountsDigest(accounts []CheckpointAccount) string {
	d := newAccountsDigester(int64(len(accounts)))
	for i := range accounts {
		d.add(&accounts[i])
	}
	return d.sum()
}

// headerDigest is the digest of a checkpoint: every field but Digest and
// Accounts (which AccountsDigest stands for).
func headerDigest(c *Checkpoint) string {
	h := sha256.New()
	writeString(h, "capledger checkpoint v1")
	writeInt(h, c.Seq)
	writeInt(h, c.Through)
	writeInt(h, c.CutAt.UnixNano())
	writeInt(h, c.Entries)
	writeInt(h, c.Moves)
	writeString(h, c.Prev)
	writeString(h, c.AccountsDigest)
	return digestHex(h)
}

// Seal sets AccountsDigest (from Accounts) and Digest. A checkpoint whose
// fields change afterwards no longer verifies.
func (c *Checkpoint) Seal() {
	c.AccountsDigest = accountsDigest(c.Accounts)
	c.Digest = headerDigest(c)
}

// Header returns c without its accounts.
func (c *Checkpoint) Header() Checkpoint {
	h := *c
	h.Accounts = nil
	return h
}

// checkpointBuilder counts what the next checkpoint summarises while an
// audit reads the journal: the entries up to the cut and the moves among
// them. Each account's part (its replay since the previous checkpoint,
// and the SHA-256 chain of its entries) is kept in the audit's replay of
// the account, only for the accounts with entries since; the checkpoint's
// accounts are merged in key order from those, the previous checkpoint's
// accounts and the ledger's accounts at the end (Snapshot.cutCheckpoint),
// so a ledger of a million accounts of which a thousand moved costs a
// thousand replays, not a million.
type checkpointBuilder struct {
	prev    *Checkpoint
	through int64
	entries int64
	moves   map[string]bool
	isMove  map[string]bool
	buf     []byte // reused for the encodings hashed
}

func newCheckpointBuilder(prev *Checkpoint, through int64, moves []Move) *checkpointBuilder {
	b := &checkpointBuilder{prev: prev, through: through, moves: map[string]bool{},
		isMove: make(map[string]bool, len(moves)), buf: make([]byte, 0, 512)}
	for i := range moves {
		b.isMove[moves[i].ReceiptID] = true
	}
	if prev != nil {
		b.entries = prev.Entries
	}
	return b
}

// add takes one entry at position pos into r, its account's replay: an
// entry within the cut is chained into r's digest and counted (the
// caller sums its delta into r, apart when after the cut, so the
// checkpoint's vector leaves it out).
func (b *checkpointBuilder) add(pos int64, e *JournalEntry, r *replay) {
	if pos > b.through {
		return
	}
	// The chain is SHA-256(previous link || entry), 32 bytes per account
	// rather than a running hash's state.
	b.buf = appendEntry(append(b.buf[:0], r.chain[:]...), e)
	r.chain = sha256.Sum256(b.buf)
	r.entries++
	b.entries++
	if e.ReceiptID != "" && b.isMove[e.ReceiptID] {
		b.moves[e.ReceiptID] = true
	}
}

// header returns the next checkpoint's header, cut at cutAt, without its
// accounts or digests.
func (b *checkpointBuilder) header(cutAt time.Time) *Checkpoint {
	c := &Checkpoint{Seq: 1, Through: b.through, CutAt: cutAt.UTC(), Entries: b.entries, Moves: int64(len(b.moves))}
	if b.prev != nil {
		c.Seq, c.Prev, c.Moves = b.prev.Seq+1, b.prev.Digest, b.prev.Moves+int64(len(b.moves))
	}
	return c
}

// nextAccount returns account k's part of the next checkpoint from its
// part of the previous one (p, nil when it had none) and its replay since
// (r of rs, nil when it has no entry since), and whether it has one: an account
// untouched since keeps its vector and entry count, and its journal
// digest is that of the previous one's followed by nothing; a touched one
// adds its entries up to the cut, and its digest follows the previous
// one's with the chain of those entries.
func (b *checkpointBuilder) nextAccount(k AccountKey, p *CheckpointAccount, rs *replaySet, r *replay) (CheckpointAccount, bool) {
	touched := r != nil && r.entries > 0
	if p == nil && !touched {
		return CheckpointAccount{}, false
	}
	out := CheckpointAccount{Account: k}
	prevJournal := ""
	if p != nil {
		out.Balances, out.Entries, prevJournal = p.Balances, p.Entries, p.Journal
	}
	b.buf = appendVarString(b.buf[:0], prevJournal)
	if touched {
		rs.addTo(r, &out.Balances, true)
		out.Entries += r.entries
		b.buf = append(b.buf, r.chain[:]...)
	}
	sum := sha256.Sum256(b.buf)
	out.Journal = hex.EncodeToString(sum[:])
	return out, true
}

// VerifyCheckpoints checks a checkpoint chain, oldest first: headers (their
// Accounts may be nil) except for the last, whose accounts must be given
// when it has any. It returns every discrepancy (none for a sound chain):
//   - each checkpoint's digest is that of its fields, and the last one's
//     accounts digest that of its accounts;
//   - each one names the previous one's digest, numbers one more, and
//     summarises a later position, no fewer entries and no fewer moves;
//   - every closing vector of the last one satisfies the conservation
//     equation with no negative term, its accounts are in key order and
//     their entry counts add up to its Entries.
func VerifyCheckpoints(chain []Checkpoint) []Discrepancy {
	out := verifyCheckpointHeaders(chain)
	if len(chain) == 0 {
		return out
	}
	last := &chain[len(chain)-1]
	if last.Accounts == nil && last.Entries == 0 {
		return out
	}
	v := newCheckpointVerifier(last)
	for i := range last.Accounts {
		v.account(&last.Accounts[i])
	}
	return append(out, v.finish(func(yield func(*CheckpointAccount) error) error {
		for i := range last.Accounts {
			if err := yield(&last.Accounts[i]); err != nil {
				return err
			}
		}
		return nil
	})...)
}

// verifyCheckpointHeaders checks every header of a chain, oldest first
// (VerifyCheckpoints' first check and its second).
func verifyCheckpointHeaders(chain []Checkpoint) []Discrepancy {
	var out []Discrepancy
	add := func(format string, args ...any) {
		out = append(out, Discrepancy{Check: CheckCheckpoint, Detail: fmt.Sprintf(format, args...)})
	}
	for i := range chain {
		c := &chain[i]
		if got := headerDigest(c); got != c.Digest {
			add("checkpoint %d: digest %s, its fields give %s", c.Seq, c.Digest, got)
		}
		if i == 0 {
			if c.Seq < 1 || (c.Seq == 1) != (c.Prev == "") {
				add("checkpoint %d names previous %q", c.Seq, c.Prev)
			}
			continue
		}
		p := &chain[i-1]
		switch {
		case c.Seq != p.Seq+1:
			add("checkpoint %d follows %d", c.Seq, p.Seq)
		case c.Prev != p.Digest:
			add("checkpoint %d names previous %s, checkpoint %d is %s", c.Seq, c.Prev, p.Seq, p.Digest)
		case c.Through <= p.Through || c.Entries < p.Entries || c.Moves < p.Moves:
			add("checkpoint %d (through %d, %d entries, %d moves) does not extend %d (through %d, %d entries, %d moves)",
				c.Seq, c.Through, c.Entries, c.Moves, p.Seq, p.Through, p.Entries, p.Moves)
		}
	}
	return out
}

// checkpointVerifier checks the last checkpoint's accounts as they are
// read in key order, one at a time (VerifyCheckpoints' last checks).
type checkpointVerifier struct {
	last    *Checkpoint
	count   int64
	entries int64
	prevKey AccountKey
	out     []Discrepancy
}

func newCheckpointVerifier(last *Checkpoint) *checkpointVerifier {
	return &checkpointVerifier{last: last}
}

func (v *checkpointVerifier) add(account AccountKey, format string, args ...any) {
	acc := ""
	if account != (AccountKey{}) {
		acc = account.String()
	}
	v.out = append(v.out, Discrepancy{Check: CheckCheckpoint, Account: acc, Detail: fmt.Sprintf(format, args...)})
}

// account checks the next of the last checkpoint's accounts.
func (v *checkpointVerifier) account(a *CheckpointAccount) {
	v.entries += a.Entries
	if v.count > 0 && v.prevKey.Compare(a.Account) >= 0 {
		v.add(a.Account, "checkpoint %d: accounts out of key order", v.last.Seq)
	}
	v.count++
	v.prevKey = a.Account
	for d := range a.Balances {
		if err := checkBalance(&a.Balances[d]); err != nil {
			v.add(a.Account, "checkpoint %d dimension %d: %v", v.last.Seq, d, err)
		}
	}
}

// finish returns what the checks found, once every account was given to
// account: the accounts digest, read again through accounts (its count
// comes first), the order, the vectors and the entry counts.
func (v *checkpointVerifier) finish(accounts func(yield func(*CheckpointAccount) error) error) []Discrepancy {
	perAccount := v.out
	v.out = nil
	d := newAccountsDigester(v.count)
	var again int64
	err := accounts(func(a *CheckpointAccount) error {
		again++
		d.add(a)
		return nil
	})
	switch {
	case err != nil:
		v.add(AccountKey{}, "checkpoint %d: accounts could not be read whole: %v", v.last.Seq, err)
	case again != v.count:
		v.add(AccountKey{}, "checkpoint %d: %d accounts, then %d read again", v.last.Seq, v.count, again)
	default:
		if got := d.sum(); got != v.last.AccountsDigest {
			v.add(AccountKey{}, "checkpoint %d: accounts digest %s, its accounts give %s", v.last.Seq, v.last.AccountsDigest, got)
		}
	}
	v.out = append(v.out, perAccount...)
	if v.entries != v.last.Entries {
		v.add(AccountKey{}, "checkpoint %d: accounts summarise %d entries, the checkpoint %d", v.last.Seq, v.entries, v.last.Entries)
	}
	return v.out
}
