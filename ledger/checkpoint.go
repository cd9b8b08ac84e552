package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"maps"
	"slices"
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
	// checkpoint's Journal followed by the encoding of each entry since.
	Entries int64
	Journal string
}

// CheckCheckpoint names the audit check of the checkpoint chain.
const CheckCheckpoint = "checkpoint_chain"

// digestHex is the hex form of a hash's sum.
func digestHex(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

func writeString(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}

func writeInt(h hash.Hash, v int64) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(v))
	h.Write(n[:])
}

func writeKey(h hash.Hash, k AccountKey) {
	writeString(h, k.Subject)
	writeString(h, k.Route)
	writeString(h, k.Region)
	writeInt(h, int64(k.Generation))
}

func writeBalances(h hash.Hash, b *Balances) {
	for i := range b {
		x := &b[i]
		for _, v := range [...]Units{x.Opening, x.Minted, x.OverdraftIssued, x.Available, x.Reserved, x.Spent,
			x.RetiredForEmergency, x.RetiredForMove, x.OverdraftRepaid} {
			writeInt(h, v)
		}
	}
}

// writeEntry writes the canonical encoding of a journal entry: every field,
// so the digest changes with any of them.
func writeEntry(h hash.Hash, e *JournalEntry) {
	at := int64(0)
	if !e.At.IsZero() {
		at = e.At.UnixNano()
	}
	writeInt(h, at)
	writeInt(h, int64(e.Kind))
	writeKey(h, e.Account)
	writeString(h, e.ReservationID)
	writeInt(h, int64(e.From)<<8|int64(e.To))
	writeString(h, e.ReceiptID)
	writeBalances(h, &e.Delta)
}

// accountsDigest is the digest of a checkpoint's accounts.
func accountsDigest(accounts []CheckpointAccount) string {
	h := sha256.New()
	writeInt(h, int64(len(accounts)))
	for i := range accounts {
		a := &accounts[i]
		writeKey(h, a.Account)
		writeBalances(h, &a.Balances)
		writeInt(h, a.Entries)
		writeString(h, a.Journal)
	}
	return digestHex(h)
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

// checkpointBuilder accumulates the next checkpoint while an audit reads
// the journal: the previous checkpoint's vectors plus every entry up to
// the cut. It holds a replay only for the accounts with entries since the
// previous checkpoint; the others are read from the previous checkpoint's
// accounts (in key order) when one is touched or the checkpoint finished,
// so a ledger of a million accounts of which a thousand moved in an epoch
// costs a thousand replays, not a million hashes.
type checkpointBuilder struct {
	prev     *Checkpoint
	through  int64
	accounts map[AccountKey]*building
	entries  int64
	moves    map[string]bool
	isMove   map[string]bool
}

type building struct {
	balances Balances
	entries  int64
	h        hash.Hash
}

func newCheckpointBuilder(prev *Checkpoint, through int64, moves []Move) *checkpointBuilder {
	b := &checkpointBuilder{prev: prev, through: through, accounts: map[AccountKey]*building{},
		moves: map[string]bool{}, isMove: make(map[string]bool, len(moves))}
	for i := range moves {
		b.isMove[moves[i].ReceiptID] = true
	}
	if prev != nil {
		b.entries = prev.Entries
	}
	return b
}

// prevAccount returns the previous checkpoint's part of account k, nil
// when it has none.
func (b *checkpointBuilder) prevAccount(k AccountKey) *CheckpointAccount {
	if b.prev == nil {
		return nil
	}
	return findCheckpointAccount(b.prev.Accounts, k)
}

// findCheckpointAccount finds k in accounts, which are in key order (as
// VerifyCheckpoints requires of a checkpoint's), nil when absent.
func findCheckpointAccount(accounts []CheckpointAccount, k AccountKey) *CheckpointAccount {
	i, found := slices.BinarySearchFunc(accounts, k, func(a CheckpointAccount, k AccountKey) int { return a.Account.Compare(k) })
	if !found {
		return nil
	}
	return &accounts[i]
}

// add takes one entry at position pos, if it is within the cut.
func (b *checkpointBuilder) add(pos int64, e *JournalEntry) {
	if pos > b.through {
		return
	}
	a := b.accounts[e.Account]
	if a == nil {
		a = &building{h: sha256.New()}
		if p := b.prevAccount(e.Account); p != nil {
			a.balances, a.entries = p.Balances, p.Entries
			writeString(a.h, p.Journal)
		} else {
			writeString(a.h, "")
		}
		b.accounts[e.Account] = a
	}
	a.balances.Add(&e.Delta)
	a.entries++
	writeEntry(a.h, e)
	b.entries++
	if e.ReceiptID != "" && b.isMove[e.ReceiptID] {
		b.moves[e.ReceiptID] = true
	}
}

// each calls f with every account of the checkpoint in key order: the
// previous checkpoint's accounts merged with those touched since. An
// untouched account keeps its vector and entry count; its journal digest
// is that of the previous one's followed by nothing, as if its replay had
// been held all along.
func (b *checkpointBuilder) each(f func(a *CheckpointAccount)) {
	touched := slices.SortedFunc(maps.Keys(b.accounts), AccountKey.Compare)
	var prev []CheckpointAccount
	if b.prev != nil {
		prev = b.prev.Accounts
	}
	h := sha256.New()
	var out CheckpointAccount
	for i, j := 0, 0; i < len(prev) || j < len(touched); {
		var c int
		switch {
		case i == len(prev):
			c = 1
		case j == len(touched):
			c = -1
		default:
			c = prev[i].Account.Compare(touched[j])
		}
		if c < 0 {
			p := &prev[i]
			h.Reset()
			writeString(h, p.Journal)
			out = CheckpointAccount{Account: p.Account, Balances: p.Balances, Entries: p.Entries, Journal: digestHex(h)}
			i++
		} else {
			k := touched[j]
			a := b.accounts[k]
			out = CheckpointAccount{Account: k, Balances: a.balances, Entries: a.entries, Journal: digestHex(a.h)}
			j++
			if c == 0 {
				i++
			}
		}
		f(&out)
	}
}

func (b *checkpointBuilder) finish(cutAt time.Time) *Checkpoint {
	c := &Checkpoint{Seq: 1, Through: b.through, CutAt: cutAt.UTC(), Entries: b.entries, Moves: int64(len(b.moves))}
	if b.prev != nil {
		c.Seq, c.Prev, c.Moves = b.prev.Seq+1, b.prev.Digest, b.prev.Moves+int64(len(b.moves))
	}
	n := len(b.accounts)
	if b.prev != nil {
		n = max(n, len(b.prev.Accounts))
	}
	c.Accounts = make([]CheckpointAccount, 0, n)
	b.each(func(a *CheckpointAccount) { c.Accounts = append(c.Accounts, *a) })
	c.Seal()
	return c
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
	var out []Discrepancy
	add := func(account AccountKey, format string, args ...any) {
		acc := ""
		if account != (AccountKey{}) {
			acc = account.String()
		}
		out = append(out, Discrepancy{Check: CheckCheckpoint, Account: acc, Detail: fmt.Sprintf(format, args...)})
	}
	for i := range chain {
		c := &chain[i]
		if got := headerDigest(c); got != c.Digest {
			add(AccountKey{}, "checkpoint %d: digest %s, its fields give %s", c.Seq, c.Digest, got)
		}
		if i == 0 {
			if c.Seq < 1 || (c.Seq == 1) != (c.Prev == "") {
				add(AccountKey{}, "checkpoint %d names previous %q", c.Seq, c.Prev)
			}
			continue
		}
		p := &chain[i-1]
		switch {
		case c.Seq != p.Seq+1:
			add(AccountKey{}, "checkpoint %d follows %d", c.Seq, p.Seq)
		case c.Prev != p.Digest:
			add(AccountKey{}, "checkpoint %d names previous %s, checkpoint %d is %s", c.Seq, c.Prev, p.Seq, p.Digest)
		case c.Through <= p.Through || c.Entries < p.Entries || c.Moves < p.Moves:
			add(AccountKey{}, "checkpoint %d (through %d, %d entries, %d moves) does not extend %d (through %d, %d entries, %d moves)",
				c.Seq, c.Through, c.Entries, c.Moves, p.Seq, p.Through, p.Entries, p.Moves)
		}
	}
	if len(chain) == 0 {
		return out
	}
	last := &chain[len(chain)-1]
	if last.Accounts == nil && last.Entries == 0 {
		return out
	}
	if got := accountsDigest(last.Accounts); got != last.AccountsDigest {
		add(AccountKey{}, "checkpoint %d: accounts digest %s, its accounts give %s", last.Seq, last.AccountsDigest, got)
	}
	var entries int64
	for i := range last.Accounts {
		a := &last.Accounts[i]
		entries += a.Entries
		if i > 0 && last.Accounts[i-1].Account.Compare(a.Account) >= 0 {
			add(a.Account, "checkpoint %d: accounts out of key order", last.Seq)
		}
		for d := range a.Balances {
			if err := checkBalance(&a.Balances[d]); err != nil {
				add(a.Account, "checkpoint %d dimension %d: %v", last.Seq, d, err)
			}
		}
	}
	if entries != last.Entries {
		add(AccountKey{}, "checkpoint %d: accounts summarise %d entries, the checkpoint %d", last.Seq, entries, last.Entries)
	}
	return out
}
