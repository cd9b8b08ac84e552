package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var journalT0 = time.Date(2026, 7, 19, 14, 0, 0, 123, time.UTC)

// journalSample returns entries that exercise every field of the batch
// encoding: repeated and new account keys (more than the linear search
// covers), zero and decreasing times, empty and non-ASCII strings, every
// dimension, deltas too long for a one-byte length.
func journalSample() []ledger.JournalEntry {
	var out []ledger.JournalEntry
	big := ledger.Balances{}
	for d := range big {
		big[d] = ledger.Balance{Opening: math.MaxInt64, Minted: math.MinInt64, OverdraftIssued: -1, Available: 1 << 62,
			Reserved: -(1 << 62), Spent: 7, RetiredForEmergency: 8, RetiredForMove: 9, OverdraftRepaid: math.MaxInt64}
	}
	for i := 0; i < 30; i++ {
		e := ledger.JournalEntry{
			At:            journalT0.Add(time.Duration(i%7-3) * time.Second),
			Kind:          ledger.Kind(i % 256),
			Account:       ledger.AccountKey{Subject: fmt.Sprintf("tenant-%d", i%11), Route: "chat", Region: "eu", Generation: uint64(i % 3)},
			ReservationID: fmt.Sprintf("rl-%03d", i),
			From:          ledger.StateReserved,
			To:            ledger.StateStarted,
			Delta:         ledger.Balances{{Available: -600, Reserved: 600}, {Available: int64(-i), Reserved: int64(i)}},
		}
		switch i % 5 {
		case 0:
			e.At = time.Time{}
			e.ReservationID = ""
			e.ReceiptID = "mv-ü-\x00-" + fmt.Sprint(i)
		case 1:
			e.Delta = big
			e.Account.Generation = math.MaxInt64
		case 2:
			e.Delta = ledger.Balances{}
			e.Account.Subject = ""
		}
		out = append(out, e)
	}
	return out
}

func TestJournalBatchRoundTrip(t *testing.T) {
	for _, entries := range [][]ledger.JournalEntry{nil, journalSample()[:1], journalSample()} {
		blob, err := appendJournalBatch([]byte("prefix"), entries)
		if err != nil {
			t.Fatal(err)
		}
		if string(blob[:6]) != "prefix" {
			t.Fatalf("appendJournalBatch overwrote dst: %q", blob[:6])
		}
		before := []ledger.JournalEntry{{ReservationID: "earlier"}}
		got, err := decodeJournalBatch(before, blob[6:])
		if err != nil {
			t.Fatalf("%d entries: %v", len(entries), err)
		}
		want := append([]ledger.JournalEntry{{ReservationID: "earlier"}}, entries...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%d entries: decoded\n%+v\nwant\n%+v", len(entries), got, want)
		}
	}
}

func TestJournalBatchRefusesWhatItCannotStore(t *testing.T) {
	for name, e := range map[string]ledger.JournalEntry{
		"generation above MaxInt64": {At: journalT0, Account: ledger.AccountKey{Generation: math.MaxInt64 + 1}},
		"time on the Unix epoch":    {At: time.Unix(0, 0)},
		"time past MaxTime":         {At: codec.MaxTime.Add(time.Second)},
	} {
		if _, err := appendJournalBatch(nil, []ledger.JournalEntry{e}); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// Every truncation and every single-byte change of a valid batch either
// decodes or fails with codec.ErrCorrupt; none panics.
func TestJournalBatchCorrupt(t *testing.T) {
	blob, err := appendJournalBatch(nil, journalSample())
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(blob); n++ {
		if _, err := decodeJournalBatch(nil, blob[:n]); !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("truncated to %d of %d bytes: %v, want ErrCorrupt", n, len(blob), err)
		}
	}
	if _, err := decodeJournalBatch(nil, append(blob, 0)); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("trailing byte: %v, want ErrCorrupt", err)
	}
	for i := range blob {
		for _, v := range []byte{0, 0x7f, 0x80, 0xff} {
			mutated := append([]byte(nil), blob...)
			mutated[i] = v
			if _, err := decodeJournalBatch(nil, mutated); err != nil && !errors.Is(err, codec.ErrCorrupt) {
				t.Fatalf("byte %d = %#x: %v does not wrap ErrCorrupt", i, v, err)
			}
		}
	}
	// A count no blob of this size can hold is refused before allocating.
	huge := binaryUvarint(tagJournalBatchV1, 1<<40)
	if _, err := decodeJournalBatch(nil, huge); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("huge count: %v, want ErrCorrupt", err)
	}
}

func binaryUvarint(tag byte, v uint64) []byte {
	out := []byte{tag}
	for v >= 0x80 {
		out = append(out, byte(v)|0x80)
		v >>= 7
	}
	return append(out, byte(v))
}

// FuzzJournalBatch: decoding arbitrary bytes never panics, fails only
// with codec.ErrCorrupt, and what decodes re-encodes to the same entries.
func FuzzJournalBatch(f *testing.F) {
	blob, err := appendJournalBatch(nil, journalSample())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(blob)
	f.Add([]byte{tagJournalBatchV1, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		entries, err := decodeJournalBatch(nil, in)
		if err != nil {
			if !errors.Is(err, codec.ErrCorrupt) {
				t.Fatalf("%x: %v does not wrap ErrCorrupt", in, err)
			}
			return
		}
		again, err := appendJournalBatch(nil, entries)
		if err != nil {
			t.Fatalf("%x: decoded %+v, which does not encode: %v", in, entries, err)
		}
		back, err := decodeJournalBatch(nil, again)
		if err != nil || !reflect.DeepEqual(back, entries) {
			t.Fatalf("%x: %+v re-decodes as %+v, %v", in, entries, back, err)
		}
	})
}

// legacyJournalInsert is how schema versions 1 and 2 wrote a journal
// entry: one row of the journal table.
func legacyJournalInsert(t *testing.T, db *sql.DB, e *ledger.JournalEntry) {
	t.Helper()
	var c codec.Conv
	_, err := db.Exec(insertSQL("journal", journalCols), c.Nanos(e.At), int64(e.Kind), e.Account.Subject, e.Account.Route,
		e.Account.Region, c.Int(e.Account.Generation), e.ReservationID, int64(e.From), int64(e.To), e.ReceiptID,
		codec.EncodeBalances(&e.Delta))
	if err != nil || c.Err() != nil {
		t.Fatal(err, c.Err())
	}
}

// A database that schema version 2 created, with journal rows, opens under
// this binary: it migrates, keeps its rows, and Snapshot returns the old
// rows first, then what the new binary wrote, each entry as written.
func TestJournalOfAnEarlierSchemaStillAudits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v2.db")
	db := dbAtSchema(t, path, 2)
	sample := journalSample()
	old, fresh := sample[:12], sample[12:]
	for i := range old {
		legacyJournalInsert(t, db, &old[i])
	}
	s := openUpgraded(t, db, path)
	// Two writes in one transaction, then one more transaction: three
	// batches after the old rows.
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range [][]ledger.JournalEntry{fresh[:5], fresh[5:7]} {
		if err := tx.Write(ctx, &store.Changes{Journal: part}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Journal: fresh[7:]}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(snap.Journal, sample) {
		t.Fatalf("snapshot journal:\n%+v\nwant\n%+v", snap.Journal, sample)
	}
	var versions, batches int
	if err := s.readDB.QueryRow("SELECT count(*) FROM schema_migrations").Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if err := s.readDB.QueryRow("SELECT count(*) FROM journal_batches").Scan(&batches); err != nil {
		t.Fatal(err)
	}
	if versions != SchemaVersion() || batches != 3 {
		t.Fatalf("%d schema versions, %d journal batches; want %d and 3", versions, batches, SchemaVersion())
	}
}

// A batch that cannot be decoded fails the snapshot (an audit must not
// silently skip entries).
func TestSnapshotRefusesACorruptJournalBatch(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Journal: journalSample()[:3]}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("UPDATE journal_batches SET entries = substr(entries, 1, length(entries) - 1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(ctx); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("snapshot of a truncated batch: %v, want ErrCorrupt", err)
	}
}

// applyCommand runs one ledger command as the engine does: Begin, Apply
// over a store.Book, Write, Commit.
func applyCommand(t *testing.T, s *Store, cmd *ledger.Command, now time.Time) ledger.Result {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	book := store.NewBook(ctx, tx, 1)
	res := ledger.Apply(book, cmd, now)
	if err := book.Err(); err != nil {
		t.Fatalf("%s: %v", cmd.Kind, err)
	}
	if c := book.Changes(); !c.Empty() {
		if err := tx.Write(ctx, c); err != nil {
			t.Fatalf("%s: %v", cmd.Kind, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("%s: %v", cmd.Kind, err)
	}
	if res.Err != nil {
		t.Fatalf("%s %s: %v", cmd.Kind, cmd.ReservationID, res.Err)
	}
	return res
}

// A ledger that a schema-2 binary wrote (its journal one row per entry in
// the journal table) migrates, takes more commands, and audits clean: the
// journal replays across the old rows and the new batches.
func TestLedgerOfAnEarlierSchemaAudits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	key := ledger.PolicyKey{Subject: "tenant7", Route: "chat.generate", Region: "eu"}
	reserve := func(id string) *ledger.Command {
		return &ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{100}}
	}
	settle := func(id string, units int64) *ledger.Command {
		return &ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{units}}
	}
	start := func(id string) *ledger.Command {
		return &ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id}
	}

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	policy := ledger.Policy{Key: key, HoldTTL: 30 * time.Second,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 10000, RefillUnits: 100, RefillInterval: time.Second}}}.WithDefaults()
	applyCommand(t, s, &ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}, now)
	for i := range 5 {
		applyCommand(t, s, reserve(fmt.Sprintf("rl-old-%d", i)), now)
	}
	applyCommand(t, s, start("rl-old-0"), now.Add(time.Second))
	applyCommand(t, s, settle("rl-old-0", 40), now.Add(2*time.Second))
	applyCommand(t, s, &ledger.Command{Kind: ledger.KindRelease, ReservationID: "rl-old-1"}, now.Add(2*time.Second))
	applyCommand(t, s, start("rl-old-3"), now.Add(time.Second))
	applyCommand(t, s, &ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "rl-old-3"}, now.Add(2*time.Second))
	before, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Rewrite the file as schema version 2 left it: every entry a row of
	// journal, no journal_batches, no index of USAGE_UNKNOWN rows, no
	// unknown_at, versions 1 and 2 recorded.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range before.Journal {
		legacyJournalInsert(t, db, &before.Journal[i])
	}
	for _, q := range []string{"DROP TABLE journal_batches", "DROP INDEX reservations_usage_unknown_at",
		"ALTER TABLE reservations DROP COLUMN unknown_at",
		"DROP TABLE tombstones", "DROP TABLE retained", "DROP INDEX reservations_finished", // version 7
		"DROP TABLE rollouts",                                      // version 8
		"DROP TABLE checkpoint_accounts", "DROP TABLE checkpoints", // version 9
		"DROP TABLE resolver_answers", "DROP TABLE audit_records", // version 10
		"DROP TABLE reservation_subjects",                                                // version 12 (which dropped version 10's index)
		"DROP TABLE account_debtors",                                                     // version 13
		"DROP INDEX shards_unreconciled",                                                 // version 22
		"DROP INDEX accounts_by_route",                                                   // version 21
		"DROP INDEX policies_key",                                                        // version 20
		"DROP INDEX accounts_by_epoch_across",                                            // version 19
		"DROP INDEX accounts_by_epoch", "ALTER TABLE accounts DROP COLUMN epoch_indexed", // version 14 (version 6 builds the index again)
		"DROP INDEX statements_by_end", // version 17
		"DELETE FROM schema_migrations WHERE version > 2"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	migrated, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(migrated.Journal, before.Journal) {
		t.Fatalf("journal after migration:\n%+v\nwant\n%+v", migrated.Journal, before.Journal)
	}
	// The USAGE_UNKNOWN reservation of the old file is in the index the
	// migration built, marked (the file did not record when) at its start,
	// a second before it really was.
	backlog, err := s.ReservationsUnknownBacklog(ctx)
	if err != nil || backlog != (store.UnknownBacklog{Count: 1, OldestMarkedAt: now.Add(time.Second)}) {
		t.Fatalf("backlog after migration: %+v, %v; want rl-old-3's start", backlog, err)
	}
	unknown, err := s.ReservationsUnknown(ctx, store.UnknownFilter{Subject: key.Subject, Limit: 10})
	if err != nil || len(unknown) != 1 || unknown[0].ID != "rl-old-3" || !unknown[0].UnknownAt.Equal(now.Add(time.Second)) {
		t.Fatalf("USAGE_UNKNOWN after migration: %+v, %v; want rl-old-3 marked at its start", unknown, err)
	}
	for _, r := range migrated.Reservations {
		if r.ID != "rl-old-3" && !r.UnknownAt.IsZero() {
			t.Fatalf("%s never marked, migrated with unknown-at %s", r.ID, r.UnknownAt)
		}
	}
	later := now.Add(3 * time.Second)
	for i := range 6 {
		applyCommand(t, s, reserve(fmt.Sprintf("rl-new-%d", i)), later)
	}
	applyCommand(t, s, start("rl-old-2"), later)
	applyCommand(t, s, settle("rl-old-2", 100), later)
	applyCommand(t, s, start("rl-new-0"), later)
	applyCommand(t, s, settle("rl-new-0", 10), later)
	applyCommand(t, s, settle("rl-old-3", 70), later)
	if backlog, err := s.ReservationsUnknownBacklog(ctx); err != nil || backlog != (store.UnknownBacklog{}) {
		t.Fatalf("backlog after settling rl-old-3: %+v, %v; want none", backlog, err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.JournalComplete || len(snap.Journal) <= len(before.Journal) ||
		!reflect.DeepEqual(snap.Journal[:len(before.Journal)], before.Journal) {
		t.Fatalf("journal: %d entries, the first %d not the old ones", len(snap.Journal), len(before.Journal))
	}
	if len(snap.Reservations) != 11 {
		t.Fatalf("%d reservations, want 11", len(snap.Reservations))
	}
	for _, d := range ledger.Audit(snap) {
		t.Errorf("audit: %s", d)
	}
}
