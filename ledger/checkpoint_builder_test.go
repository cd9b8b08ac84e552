package ledger

import (
	"crypto/sha256"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

// builderPrev is a sealed checkpoint of n accounts, in key order.
func builderPrev(n int) *Checkpoint {
	c := &Checkpoint{Seq: 1, Through: 10, CutAt: time.Unix(0, 0).UTC(), Accounts: make([]CheckpointAccount, n)}
	for i := range c.Accounts {
		a := &c.Accounts[i]
		a.Account = AccountKey{Subject: fmt.Sprintf("t%07d", i), Route: "r", Region: "x", Generation: 1}
		a.Balances[0] = Balance{Opening: 5, Available: 5}
		a.Entries = 1
		a.Journal = fmt.Sprintf("%064d", i)
		c.Entries++
	}
	c.Seal()
	return c
}

// builderLedger is a ledger whose last checkpoint is prev and whose
// journal since is entries at positions from 11 on: the accounts hold
// what the replay gives.
func builderLedger(prev *Checkpoint, entries []JournalEntry) *Snapshot {
	balances := map[AccountKey]*Balances{}
	var keys []AccountKey
	for i := range prev.Accounts {
		b := prev.Accounts[i].Balances
		balances[prev.Accounts[i].Account] = &b
		keys = append(keys, prev.Accounts[i].Account)
	}
	for i := range entries {
		e := &entries[i]
		if balances[e.Account] == nil {
			balances[e.Account] = &Balances{}
			keys = append(keys, e.Account)
		}
		balances[e.Account].Add(&e.Delta)
	}
	s := &Snapshot{Checkpoints: []Checkpoint{*prev}, Journal: entries, JournalComplete: true}
	for _, k := range keys {
		s.Accounts = append(s.Accounts, Account{Key: k, Dims: 1, Balances: *balances[k]})
	}
	return s
}

// TestCheckpointBuilderMergesUntouchedAccounts: the checkpoint merged in
// key order is the one holding every account's replay gives: untouched
// accounts keep their vectors and chain their digest, touched ones add
// their entries up to the cut, new ones join in key order; emitted one at
// a time, it is the same checkpoint.
func TestCheckpointBuilderMergesUntouchedAccounts(t *testing.T) {
	prev := builderPrev(5)
	fresh := AccountKey{Subject: "t0000002a", Route: "r", Region: "x", Generation: 1}
	entries := []JournalEntry{{Kind: 1, Account: prev.Accounts[1].Account}, {Kind: 1, Account: fresh}, {Kind: 1, Account: prev.Accounts[1].Account}}
	entries[0].Delta[0] = Balance{Available: -2, Spent: 2}
	entries[1].Delta[0] = Balance{Minted: 3, Available: 3}
	entries[2].Delta[0] = Balance{Available: -1, Spent: 1} // position 13, beyond the cut
	snap := builderLedger(prev, entries)
	found, c := AuditWith(snap, AuditOptions{SinceCheckpoint: true, Cut: 12, CutAt: time.Unix(1, 0)})
	if len(found) != 0 || c == nil {
		t.Fatalf("audit: %v, checkpoint %v", found, c != nil)
	}
	if got := VerifyCheckpoints([]Checkpoint{prev.Header(), *c}); len(got) != 0 {
		t.Fatalf("the chain does not verify: %v", got)
	}
	if len(c.Accounts) != 6 || c.Accounts[3].Account != fresh || c.Entries != prev.Entries+2 {
		t.Fatalf("accounts %+v, entries %d", c.Accounts, c.Entries)
	}
	for i, want := range []int{0, 2, 4, 5} {
		a, p := c.Accounts[want], prev.Accounts[[]int{0, 2, 3, 4}[i]]
		h := sha256.New()
		writeString(h, p.Journal)
		if a.Account != p.Account || a.Balances != p.Balances || a.Entries != p.Entries || a.Journal != digestHex(h) {
			t.Fatalf("untouched account %d: %+v, previous %+v", want, a, p)
		}
	}
	touched := c.Accounts[1]
	link := sha256.New()
	link.Write(make([]byte, sha256.Size))
	writeEntry(link, &entries[0])
	h := sha256.New()
	writeString(h, prev.Accounts[1].Journal)
	h.Write(link.Sum(nil))
	if touched.Balances[0] != (Balance{Opening: 5, Available: 3, Spent: 2}) || touched.Entries != 2 || touched.Journal != digestHex(h) {
		t.Fatalf("touched account: %+v", touched)
	}

	// The same cut from streams, emitted an account at a time.
	streamed := streams(snap)
	var emitted []CheckpointAccount
	found, e := AuditWith(streamed, AuditOptions{SinceCheckpoint: true, Cut: 12, CutAt: time.Unix(1, 0),
		Emit: func(a *CheckpointAccount) error { emitted = append(emitted, *a); return nil }})
	if len(found) != 0 || e == nil || e.Accounts != nil {
		t.Fatalf("streamed audit: %v, checkpoint %+v", found, e)
	}
	if e.Digest != c.Digest || e.AccountsDigest != c.AccountsDigest || fmt.Sprint(emitted) != fmt.Sprint(c.Accounts) {
		t.Fatalf("streamed checkpoint %+v\nemitted %+v\nwant %+v", e.Header(), emitted, c.Accounts)
	}
}

// streams returns s with its accounts, its last checkpoint's accounts and
// its journal as streams, the way a store hands them over.
func streams(s *Snapshot) *Snapshot {
	out := *s
	accounts := slices.SortedFunc(slices.Values(s.Accounts), func(a, b Account) int { return a.Key.Compare(b.Key) })
	journal := s.Journal
	out.Accounts, out.Journal = nil, nil
	out.AccountStream = func(yield func(*Account) error) error {
		for i := range accounts {
			a := accounts[i]
			if err := yield(&a); err != nil {
				return err
			}
		}
		return nil
	}
	if last := s.LastCheckpoint(); last != nil {
		out.Checkpoints = append([]Checkpoint(nil), s.Checkpoints...)
		cps := last.Accounts
		out.Checkpoints[len(out.Checkpoints)-1].Accounts = nil
		out.CheckpointAccountStream = func(yield func(*CheckpointAccount) error) error {
			for i := range cps {
				a := cps[i]
				if err := yield(&a); err != nil {
					return err
				}
			}
			return nil
		}
	}
	var base int64
	if last := s.LastCheckpoint(); last != nil {
		base = last.Through
	}
	out.JournalStream = func(yield func(int64, *JournalEntry) error) error {
		for i := range journal {
			if err := yield(base+int64(i+1), &journal[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return &out
}

// TestCheckpointKeepsEntriesOfAMissingAccount: entries of an account with
// no account row (a store that lost one) still go into the checkpoint,
// under the key the journal names, as they did when the builder held
// every key; streamed or not, the same checkpoint.
func TestCheckpointKeepsEntriesOfAMissingAccount(t *testing.T) {
	prev := builderPrev(3)
	lost := AccountKey{Subject: "t0000001a", Route: "r", Region: "x", Generation: 1}
	entries := []JournalEntry{{Kind: 1, Account: lost}, {Kind: 1, Account: prev.Accounts[2].Account}}
	entries[0].Delta[0] = Balance{Minted: 3, Available: 3}
	entries[1].Delta[0] = Balance{Available: -1, Spent: 1}
	snap := builderLedger(prev, entries)
	snap.Accounts = slices.DeleteFunc(snap.Accounts, func(a Account) bool { return a.Key == lost })
	found, c := AuditWith(snap, AuditOptions{SinceCheckpoint: true, Cut: 12, CutAt: time.Unix(1, 0)})
	if len(found) != 0 || c == nil || len(c.Accounts) != 4 || c.Accounts[2].Account != lost || c.Accounts[2].Entries != 1 {
		t.Fatalf("audit: %v, checkpoint %+v", found, c)
	}
	var emitted []CheckpointAccount
	_, e := AuditWith(streams(snap), AuditOptions{SinceCheckpoint: true, Cut: 12, CutAt: time.Unix(1, 0),
		Emit: func(a *CheckpointAccount) error { emitted = append(emitted, *a); return nil }})
	if e == nil || e.Digest != c.Digest || fmt.Sprint(emitted) != fmt.Sprint(c.Accounts) {
		t.Fatalf("streamed: %+v, emitted %v", e, emitted)
	}
}

// The audit keeps the accounts of the snapshot's moves' receipts only:
// every account's opening entry names the receipt "open" and a shard
// issue its shard, and keeping those held a map entry and a subject per
// account opened since the last checkpoint for the whole audit.
func TestMoveEndsKeepOnlyMoves(t *testing.T) {
	from, to := AccountKey{Subject: "t1", Route: "r", Generation: 1}, AccountKey{Subject: "t1", Route: "r", Generation: 2}
	m := newMoveEnds([]Move{{ReceiptID: "move-1", From: from, To: to}, {ReceiptID: "move-2"}})
	for i := range 1000 {
		m.note(&JournalEntry{Kind: KindReserve, Account: AccountKey{Subject: fmt.Sprintf("t%d", i), Route: "r", Generation: 1}, ReceiptID: "open"})
	}
	m.note(&JournalEntry{Kind: KindShardIssue, Account: AccountKey{Subject: "t1", Route: "r", Generation: 1}, ReceiptID: "shard-1"})
	m.note(&JournalEntry{Kind: KindReserve, Account: AccountKey{Subject: "t2", Route: "r", Generation: 1}})
	m.note(&JournalEntry{Kind: KindDrain, Account: from, ReceiptID: "move-1"})
	m.note(&JournalEntry{Kind: KindDrain, Account: to, ReceiptID: "move-1"})
	if got := m.held(); got != 1 {
		t.Fatalf("%d receipts held; want move-1's", got)
	}
	if seen := m.seen("move-1"); seen == nil || seen.from != 1 || seen.to != 1 || seen.other != 0 {
		t.Fatalf("move-1's ends: %+v", seen)
	}
	if seen := m.seen("move-2"); seen != nil {
		t.Fatalf("move-2, never journaled, has ends %+v", seen)
	}
}

// An audit's replays give the garbage collector nothing to follow: no
// pointer in a replay, none in the index, and the replays in a few
// chunks, not one object each (a million of them during a cut over a
// million accounts).
func TestReplaysHoldNoPointers(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[replay](), reflect.TypeFor[replayMore](), reflect.TypeFor[accountID]()} {
		if hasPointers(typ) {
			t.Errorf("%s holds pointers", typ)
		}
	}
	if typ := reflect.TypeFor[replaySet]().Field(0).Type; typ.Kind() != reflect.Map || hasPointers(typ.Key()) || hasPointers(typ.Elem()) {
		t.Errorf("the index is a %s", typ)
	}
	rs := newReplaySet()
	ids := newAccountIDs()
	const n = 3*slabChunk + 5
	for i := range n {
		k := AccountKey{Subject: fmt.Sprintf("t%d", i), Route: "r", Generation: 1}
		var d Balances
		d[0].Minted, d[0].Available = int64(i), int64(i)
		if i%3 == 0 {
			d[1].Minted, d[1].Available = 1, 1 // a second dimension
		}
		r := rs.getOrAdd(ids.of(k))
		rs.add(r, &d, i%5 == 0)
		r.entries++
	}
	if len(rs.all.chunks) != 4 {
		t.Fatalf("%d replays in %d chunks", n, len(rs.all.chunks))
	}
	for i := range n {
		k := AccountKey{Subject: fmt.Sprintf("t%d", i), Route: "r", Generation: 1}
		r := rs.get(ids.of(k))
		var got Balances
		rs.addTo(r, &got, false)
		want := Balances{{Minted: int64(i), Available: int64(i)}}
		if i%3 == 0 {
			want[1] = Balance{Minted: 1, Available: 1}
		}
		if r.entries != 1 || got != want {
			t.Fatalf("account %d: %d entries, %+v; want 1, %+v", i, r.entries, got[:2], want[:2])
		}
		var cut Balances
		rs.addTo(r, &cut, true)
		if i%5 == 0 && cut != (Balances{}) || i%5 != 0 && cut != want {
			t.Fatalf("account %d cut: %+v", i, cut[:2])
		}
	}
	if rs.get(ids.of(AccountKey{Subject: "none"})) != nil {
		t.Fatal("a replay of an account never added")
	}
}

// hasPointers reports whether a value of typ holds a pointer the garbage
// collector follows.
func hasPointers(typ reflect.Type) bool {
	switch typ.Kind() {
	case reflect.Array:
		return typ.Len() > 0 && hasPointers(typ.Elem())
	case reflect.Struct:
		for i := range typ.NumField() {
			if hasPointers(typ.Field(i).Type) {
				return true
			}
		}
		return false
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return false
	}
	return true
}
