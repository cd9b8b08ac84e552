package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"
)

// goldenLedger is a fixed ledger whose next checkpoint the golden test
// cuts: a last checkpoint of 40 accounts, then 400 entries over 70
// accounts (some new, some with a second dimension, reservation and move
// receipt ids, unicode keys, entries beyond the cut) and one account row
// lost, as TestCheckpointKeepsEntriesOfAMissingAccount has it.
func goldenLedger() (*Snapshot, AccountKey) {
	prev := builderPrev(40)
	key := func(i int) AccountKey {
		switch {
		case i%11 == 3:
			return AccountKey{Subject: fmt.Sprintf("tenant-é%d", i), Route: "llm.tokens", Region: "eu-1", Generation: uint64(i % 3)}
		case i < 40:
			return prev.Accounts[i].Account
		}
		return AccountKey{Subject: fmt.Sprintf("t%07da", i), Route: "r", Region: "x", Generation: 1}
	}
	var entries []JournalEntry
	for i := range 400 {
		e := JournalEntry{At: time.Unix(1_700_000_000+int64(i), int64(i)*1000).UTC(), Kind: Kind(1 + i%5), Account: key((i * 17) % 70),
			From: State(i % 4), To: State((i + 1) % 7)}
		if i%3 != 0 {
			e.ReservationID = fmt.Sprintf("res-%05d", i)
		}
		if i%29 == 0 {
			e.ReceiptID = fmt.Sprintf("receipt-%d", i)
		}
		e.Delta[0] = Balance{Minted: int64(1 + i%5), Available: int64(1+i%5) - int64(i%2), Reserved: int64(i % 2)}
		if i%13 == 0 {
			e.Delta[1] = Balance{Opening: 7, Available: 7}
		}
		entries = append(entries, e)
	}
	snap := builderLedger(prev, entries)
	for i := range snap.Accounts {
		snap.Accounts[i].Dims = 2
	}
	lost := key(45)
	snap.Accounts = slices.DeleteFunc(snap.Accounts, func(a Account) bool { return a.Key == lost })
	return snap, lost
}

// goldenCut is what the golden ledger's checkpoint, cut through position
// 380 of its journal (so 30 entries are beyond the cut), digests to: the
// header's digest (which covers the accounts digest) and the SHA-256 of
// the accounts' fields as printed. Recorded from main at cae07cc, before
// the cut hashed from reused buffers and staged its accounts; a change
// here is a change of the stored format.
const (
	goldenDigest   = "47de57aae7097e339eae0b461630a9180cdb62007444a7809ea68539d98c53c6"
	goldenAccounts = "8c770830dd7c568df201f15338dd789d3e3022425828abfc448c693247452329"
)

// TestCheckpointCutIsByteIdentical: the checkpoint a cut writes, kept whole
// or emitted an account at a time from streams, is the one main cut on
// the same ledger, field for field.
func TestCheckpointCutIsByteIdentical(t *testing.T) {
	snap, lost := goldenLedger()
	opts := AuditOptions{SinceCheckpoint: true, Cut: 380, CutAt: time.Unix(1_700_001_000, 5).UTC()}
	found, c := AuditWith(snap, opts)
	if len(found) != 0 || c == nil {
		t.Fatalf("audit: %v, checkpoint %v", found, c != nil)
	}
	if !slices.ContainsFunc(c.Accounts, func(a CheckpointAccount) bool { return a.Account == lost }) {
		t.Fatalf("the lost account's entries are not in the checkpoint")
	}
	if got := VerifyCheckpoints([]Checkpoint{snap.Checkpoints[0].Header(), *c}); len(got) != 0 {
		t.Fatalf("the chain does not verify: %v", got)
	}
	printed := func(accounts []CheckpointAccount) string {
		sum := sha256.Sum256(fmt.Appendf(nil, "%+v", accounts))
		return hex.EncodeToString(sum[:])
	}
	if c.Digest != goldenDigest || printed(c.Accounts) != goldenAccounts {
		t.Errorf("checkpoint of %d accounts: digest %s, accounts %s; want %s, %s", len(c.Accounts), c.Digest, printed(c.Accounts), goldenDigest, goldenAccounts)
	}
	var emitted []CheckpointAccount
	opts.Emit = func(a *CheckpointAccount) error { emitted = append(emitted, *a); return nil }
	found, e := AuditWith(streams(snap), opts)
	if len(found) != 0 || e == nil || e.Digest != goldenDigest || printed(emitted) != goldenAccounts {
		t.Errorf("streamed: %v, digest %v, accounts %s", found, e != nil && e.Digest == goldenDigest, printed(emitted))
	}
	// With the keys read apart for the second pass, as SQLite reads them.
	keyed := streams(snap)
	keyed.AccountKeyStream = func(yield func(*AccountKey) error) error {
		return keyed.AccountStream(func(a *Account) error { k := a.Key; return yield(&k) })
	}
	keyed.AccountStream = func(yield func(*Account) error) error {
		return streams(snap).AccountStream(yield)
	}
	emitted = nil
	found, e = AuditWith(keyed, opts)
	if len(found) != 0 || e == nil || e.Digest != goldenDigest || printed(emitted) != goldenAccounts {
		t.Errorf("keys streamed apart: %v, digest %v, accounts %s", found, e != nil && e.Digest == goldenDigest, printed(emitted))
	}
	// Staged: the accounts read for the checks and, because of the lost
	// account, once more for the keys (a ledger without one reads them
	// once: TestCheckpointCutHoldsAPage), the read released before the
	// first emission, the stage's accounts and the lost account's merged.
	staged, stage := streams(snap), &sliceStage{}
	reads, released := 0, false
	accounts := staged.AccountStream
	staged.AccountStream = func(yield func(*Account) error) error {
		if released {
			t.Errorf("the accounts read after the release")
		}
		reads++
		return accounts(yield)
	}
	staged.Release = func() { released = true }
	emitted = nil
	opts.Stage = stage
	opts.Emit = func(a *CheckpointAccount) error {
		if !released {
			t.Errorf("%s emitted before the read was released", a.Account)
		}
		emitted = append(emitted, *a)
		return nil
	}
	found, e = AuditWith(staged, opts)
	if len(found) != 0 || e == nil || e.Digest != goldenDigest || printed(emitted) != goldenAccounts || reads != 2 || len(stage.accounts) != len(emitted)-1 {
		t.Errorf("staged: %v, digest %v, accounts %s, the accounts read %d times, %d staged", found, e != nil && e.Digest == goldenDigest,
			printed(emitted), reads, len(stage.accounts))
	}
}

// sliceStage is a CheckpointStage in memory.
type sliceStage struct{ accounts []CheckpointAccount }

func (s *sliceStage) Put(a *CheckpointAccount) error {
	s.accounts = append(s.accounts, *a)
	return nil
}

func (s *sliceStage) Each(yield func(*CheckpointAccount) error) error {
	for i := range s.accounts {
		if err := yield(&s.accounts[i]); err != nil {
			return err
		}
	}
	return nil
}
