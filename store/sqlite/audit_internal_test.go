package sqlite

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// TestAuditStreamsLongKeys: ids and account strings long and short (and
// empty), and holding the zero bytes the audit's packed row separates
// its strings with, come back whole, with their amounts, in id order.
func TestAuditStreamsLongKeys(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	var want []ledger.Reservation
	for i, n := range []int{1, 127, 128, 2047, 2048, 55296, 65535, 65536, 70000} {
		id := string(rune('a'+i)) + strings.Repeat("i", n-1)
		r := ledger.Reservation{
			ID:            id,
			RequestDigest: "d",
			Account:       ledger.AccountKey{Subject: strings.Repeat("s", n), Route: strings.Repeat("é", n/2), Region: "", Generation: uint64(i + 1)},
			State:         ledger.StateSettledWithDebt,
			Reserved:      ledger.Amounts{int64(n), 1 << 40},
			Actual:        ledger.Amounts{int64(n) + 5},
			Overdraft:     ledger.Amounts{5, 0, 0, -1},
			CreatedAt:     now, ExpiresAt: now.Add(time.Minute), FinishedAt: now,
		}
		if i%2 == 1 {
			r.Account.Region = "eu"
		}
		want = append(want, r)
	}
	// Strings holding zero bytes, which the packed row separates its
	// strings with: the first row (of an empty id), one after another
	// such row, and one between plain rows are read apart.
	for i, k := range []ledger.AccountKey{{Subject: "\x00"}, {Subject: "a\x00", Route: "r"}, {Subject: "s", Route: "\x00\x00", Region: "e\x00u"}, {Subject: "s", Route: "r", Region: "\x00"}} {
		r := want[i]
		r.ID, r.Account = []string{"", "\x00first", "\x00first\x00", "b\x00"}[i], k
		want = append(want, r)
	}
	slices.SortFunc(want, func(a, b ledger.Reservation) int { return strings.Compare(a.ID, b.ID) })
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Reservations: want}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var got []ledger.Reservation
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		return snap.ReservationStream(func(r *ledger.Reservation) error {
			got = append(got, ledger.Reservation{ID: r.ID, Account: r.Account, State: r.State, Reserved: r.Reserved, Actual: r.Actual, Overdraft: r.Overdraft})
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("streamed %d reservations, wrote %d", len(got), len(want))
	}
	for i := range want {
		w := ledger.Reservation{ID: want[i].ID, Account: want[i].Account, State: want[i].State, Reserved: want[i].Reserved, Actual: want[i].Actual, Overdraft: want[i].Overdraft}
		if got[i] != w {
			t.Errorf("reservation %d (id of %d bytes): streamed id %d bytes, account %d/%d/%d bytes gen %d, %v %v %v %v; wrote account %d/%d/%d bytes gen %d, %v %v %v %v",
				i, len(w.ID), len(got[i].ID), len(got[i].Account.Subject), len(got[i].Account.Route), len(got[i].Account.Region), got[i].Account.Generation,
				got[i].State, got[i].Reserved, got[i].Actual, got[i].Overdraft,
				len(w.Account.Subject), len(w.Account.Route), len(w.Account.Region), w.Account.Generation, w.State, w.Reserved, w.Actual, w.Overdraft)
		}
	}
}

// packAuditRow packs r as auditReservationsQuery does.
func packAuditRow(r *ledger.Reservation) []byte {
	b := codec.AppendAmounts(nil, &r.Reserved)
	b = codec.AppendAmounts(b, &r.Actual)
	b = codec.AppendAmounts(b, &r.Overdraft)
	return append(b, r.ID+"\x00"+r.Account.Subject+"\x00"+r.Account.Route+"\x00"+r.Account.Region...)
}

// A packed row splits into the strings and amounts it was packed from,
// and decodes back to them with the lengths the split found; strings
// holding zero bytes of their own are reported ambiguous.
func TestAuditRowRoundTrip(t *testing.T) {
	for _, r := range []ledger.Reservation{
		{ID: "r1", Account: ledger.AccountKey{Subject: "s", Route: "r", Region: "eu"}, Reserved: ledger.Amounts{1, 1 << 40}, Actual: ledger.Amounts{-3}, Overdraft: ledger.Amounts{0, 0, 0, 7}},
		{ID: "", Account: ledger.AccountKey{}},
		{ID: "é", Account: ledger.AccountKey{Subject: strings.Repeat("s", 300), Route: "", Region: "\xff"}, Reserved: ledger.Amounts{0, 0, 0, -1}},
	} {
		packed := packAuditRow(&r)
		at, lens, unique, err := splitAuditRow(packed)
		if err != nil || !unique {
			t.Fatalf("split %q: %v, unique %v", r.ID, err, unique)
		}
		if want := (auditLens{len(r.ID), len(r.Account.Subject), len(r.Account.Route)}); lens != want || string(packed[at:at+lens.id]) != r.ID {
			t.Errorf("split %q: lengths %v at %d, want %v", r.ID, lens, at, want)
		}
		var got ledger.Reservation
		if err := decodeAuditRow(&got, nil, packed, lens); err != nil {
			t.Fatalf("decode %q: %v", r.ID, err)
		}
		if got.ID != r.ID || got.Account != r.Account || got.Reserved != r.Reserved || got.Actual != r.Actual || got.Overdraft != r.Overdraft {
			t.Errorf("decoded %+v, packed %+v", got, r)
		}
	}
	for _, k := range []ledger.AccountKey{{Subject: "a\x00b", Route: "r", Region: "eu"}, {Subject: "s", Route: "r", Region: "e\x00u"}, {Subject: "s", Route: "\x00", Region: ""}} {
		r := ledger.Reservation{ID: "r", Account: k}
		if _, _, unique, err := splitAuditRow(packAuditRow(&r)); err != nil || unique {
			t.Errorf("split %q: %v, unique %v; want ambiguous", k, err, unique)
		}
	}
}

// A packed row cut short, or decoded with lengths its zero bytes do not
// stand at, is refused rather than read past or split elsewhere.
func TestAuditRowDamaged(t *testing.T) {
	r := ledger.Reservation{ID: "r1", Account: ledger.AccountKey{Subject: "sub", Route: "rt", Region: "eu"}, Reserved: ledger.Amounts{5, 6}, Actual: ledger.Amounts{5}, Overdraft: ledger.Amounts{}}
	packed := packAuditRow(&r)
	at, lens, _, err := splitAuditRow(packed)
	if err != nil {
		t.Fatal(err)
	}
	// Cut before the last separator: the split fails (within the region,
	// the row is a shorter region: SQLite's column length bounds it).
	for n := range at + lens.id + lens.subject + lens.route + 3 {
		if _, _, _, err := splitAuditRow(packed[:n]); err == nil {
			t.Errorf("split of the first %d of %d bytes: no error", n, len(packed))
		}
		var got ledger.Reservation
		if err := decodeAuditRow(&got, nil, packed[:n], lens); err == nil {
			t.Errorf("decode of the first %d of %d bytes: no error", n, len(packed))
		}
	}
	for _, bad := range []auditLens{
		{lens.id + 1, lens.subject, lens.route}, {lens.id, lens.subject - 1, lens.route}, {lens.id, lens.subject, lens.route + 1},
		{lens.id + 1, lens.subject - 1, lens.route}, {lens.id, lens.subject + 1, lens.route - 1},
		{-1, lens.subject, lens.route}, {lens.id, 1 << 40, lens.route}, {lens.id, lens.subject, len(packed)},
	} {
		var got ledger.Reservation
		if err := decodeAuditRow(&got, nil, packed, bad); err == nil {
			t.Errorf("decode with lengths %v (packed with %v): no error, %+v", bad, lens, got)
		}
	}
	damaged := bytes.Clone(packed)
	damaged[0] ^= 0xff // the amounts' tag
	if _, _, _, err := splitAuditRow(damaged); err == nil {
		t.Error("split with a damaged amounts tag: no error")
	}
}

// TestFullAuditEndsItsReadTransaction: a full audit's first read of the
// reservations copies the database (copyForAudit) and ends
// its read transaction, so a WAL checkpoint beside it copies every frame
// (the WAL can be reset) — before that read it cannot — and the audit
// still sees only what was committed before it began. The store's own
// checkpointer is stopped: a checkpoint of its running beside the test's
// holds the checkpoint lock, and the test's then copies nothing (-1 of -1
// frames, busy), whatever the audit holds.
func TestFullAuditEndsItsReadTransaction(t *testing.T) {
	ctx := context.Background()
	s := openWithoutCheckpointer(t)
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	account := ledger.AccountKey{Subject: "s", Route: "r", Region: "eu", Generation: 1}
	batch := 0
	commit := func(n int) {
		t.Helper()
		batch++
		c := &store.Changes{NewReservations: map[string]bool{}}
		for i := range n {
			appendReserve(c, account, fmt.Sprintf("b%03d-%04d", batch, i), now)
		}
		commitChanges(t, s, c)
	}
	// walCheckpoint runs a PASSIVE checkpoint on the (stopped)
	// checkpointer's connection and returns the WAL's frames and how many
	// it could copy. With no other checkpoint running it is never busy;
	// a busy one reports -1 of -1 frames, which proves nothing either way.
	walCheckpoint := func() (frames, copied int) {
		t.Helper()
		var busy int
		if err := s.checkpointer.db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied); err != nil {
			t.Fatal(err)
		}
		if busy != 0 || frames <= 0 {
			t.Fatalf("checkpoint busy %d, %d frames (%d copied): want a checkpoint that ran over a WAL with the test's commits", busy, frames, copied)
		}
		return frames, copied
	}
	for range 3 {
		commit(200)
	}
	var reservations, entries int
	err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		commit(200)
		if frames, copied := walCheckpoint(); copied >= frames {
			t.Errorf("with the audit's read transaction open, a checkpoint copied %d of %d WAL frames", copied, frames)
		}
		if err := snap.ReservationStream(func(*ledger.Reservation) error { reservations++; return nil }); err != nil {
			return err
		}
		commit(200)
		if frames, copied := walCheckpoint(); copied != frames {
			t.Errorf("after the reservations were read, a checkpoint copied %d of %d WAL frames: the read transaction is still open", copied, frames)
		}
		if n, err := snap.Estimate(true); err != nil || n != 1200 {
			t.Errorf("estimate after the copy: %d, %v; want 600 reservations + 600 entries", n, err)
		}
		return snap.JournalStream(func(int64, *ledger.JournalEntry) error { entries++; return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	if reservations != 600 || entries != 600 {
		t.Fatalf("the audit read %d reservations and %d journal entries, want the 600 of each committed before it began", reservations, entries)
	}
}

// TestAuditEstimateSpansTheJournal: a since-checkpoint audit's progress
// is measured against estimateRows, which samples batches over the whole
// journal since the checkpoint: a burst of large batches (a prefill)
// followed by many small ones is estimated within a factor of two, not
// from the newest batches alone (about 1/40 of it here: the bar stood at
// 99% from the first rows).
func TestAuditEstimateSpansTheJournal(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	account := ledger.AccountKey{Subject: "s", Route: "r", Region: "eu", Generation: 1}
	batch, total := 0, 0
	commit := func(n int) {
		t.Helper()
		batch++
		c := &store.Changes{NewReservations: map[string]bool{}}
		for i := range n {
			appendReserve(c, account, fmt.Sprintf("b%03d-%04d", batch, i), now)
		}
		total += n
		commitChanges(t, s, c)
	}
	for range 20 {
		commit(250)
	}
	for range 100 {
		commit(1)
	}
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		estimate, err := snap.Estimate(false)
		if err != nil {
			return err
		}
		if estimate < int64(total)/2 || estimate > 2*int64(total) {
			t.Errorf("estimate %d journal entries, want within 2x of the %d there are", estimate, total)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAuditEstimateCountsTheAccounts: the audit's estimate counts the
// accounts, which it reads after the journal, before the copy (from the
// read transaction) and after it (from the copy), as
// ledger.Snapshot.Estimate says.
func TestAuditEstimateCountsTheAccounts(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	const accounts, reservations = 300, 40
	c := &store.Changes{NewReservations: map[string]bool{}}
	for i := range accounts {
		c.Accounts = append(c.Accounts, ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%05d", i), Route: "chat", Region: "eu", Generation: 1},
			Dims: 1, EpochStart: now, Balances: ledger.Balances{{Opening: 1000, Available: 1000}}})
	}
	account := c.Accounts[0].Key
	for i := range reservations {
		appendReserve(c, account, fmt.Sprintf("r%04d", i), now)
	}
	commitChanges(t, s, c)
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		check := func(when string) {
			t.Helper()
			// One batch: the estimate of the journal is exact.
			if n, err := snap.Estimate(false); err != nil || n != reservations+accounts {
				t.Errorf("%s: estimate without the reservations %d, %v; want %d entries + %d accounts", when, n, err, reservations, accounts)
			}
			if n, err := snap.Estimate(true); err != nil || n != 2*reservations+accounts {
				t.Errorf("%s: estimate %d, %v; want %d reservations + %d entries + %d accounts", when, n, err, reservations, reservations, accounts)
			}
		}
		check("before the copy")
		if err := snap.ReservationStream(func(*ledger.Reservation) error { return nil }); err != nil {
			return err
		}
		check("after the copy")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// appendReserve adds to c a new reservation id holding one unit of
// account, and its reserve's journal entry.
func appendReserve(c *store.Changes, account ledger.AccountKey, id string, now time.Time) {
	c.Reservations = append(c.Reservations, ledger.Reservation{ID: id, RequestDigest: "d", Account: account, State: ledger.StateReserved,
		Reserved: ledger.Amounts{1}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
	c.NewReservations[id] = true
	c.Journal = append(c.Journal, ledger.JournalEntry{At: now, Kind: ledger.KindReserve, Account: account, ReservationID: id,
		From: ledger.StateRequested, To: ledger.StateReserved, Delta: ledger.Balances{{Available: -1, Reserved: 1}}})
}

// commitChanges writes c in one write transaction of its own.
func commitChanges(t *testing.T, s *Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// keyStrings gives back every string's own bytes, whichever strings share
// a slot: more strings than slots, in turn and again, and an empty one.
func TestKeyStringsGiveTheirBytes(t *testing.T) {
	keys := newKeyStrings()
	for round := range 2 {
		for i := range 3*keyStringSlots + 1 {
			b := []byte(fmt.Sprintf("tenant-%d", i))
			if i == 3*keyStringSlots {
				b = nil
			}
			if got := keys.of(b); got != string(b) {
				t.Fatalf("round %d: %q came back %q", round, b, got)
			}
		}
	}
}
