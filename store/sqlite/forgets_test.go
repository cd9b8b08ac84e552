package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// A file written before schema version 15 forgot tombstones without
// journaling it, so an id reused after its horizon shows two lives with
// no forget entry between. Version 15's migration keeps the journal
// position it found (forgets_journaled_after): the audit judges those
// old lives as before (clean), while a life begun after an ending the
// new binary journaled needs a forget entry, or it is reported. The file
// of "version 14" is one of version 15 whose migration is undone (its
// meta row and schema_migrations row deleted, and those of the later
// versions, which SQLite's migrate runs again from the greatest version
// recorded), so reopening runs it over the journal already written.
func TestForgetsJournaledAfterTheUpgrade(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "upgrade.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	account := ledger.AccountKey{Subject: "tenant", Route: "chat", Region: "eu", Generation: 1}
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	// life plants one life of id: an admission and a release that move
	// nothing, in one write (one journal position).
	life := func(s *Store, id string) {
		t.Helper()
		commitChanges(t, s, &store.Changes{Journal: []ledger.JournalEntry{
			{At: now, Kind: ledger.KindReserve, Account: account, ReservationID: id, From: ledger.StateRequested, To: ledger.StateReserved},
			{At: now, Kind: ledger.KindRelease, Account: account, ReservationID: id, From: ledger.StateReserved, To: ledger.StateReleased}}})
		now = now.Add(time.Second)
	}
	// reborn returns the ids refund_once reports admitted again with no
	// forget entry between (the planted journal names an account the
	// store does not hold: the other checks' findings are not looked at).
	reborn := func(s *Store) []string {
		t.Helper()
		var ids []string
		if err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			for _, d := range ledger.Audit(snap) {
				if d.Check == ledger.CheckRefundOnce {
					if !strings.HasPrefix(d.Detail, "admitted again") {
						t.Errorf("unexpected: %s", d)
					}
					ids = append(ids, d.Reservation)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	life(s, "old")
	life(s, "old")
	if got := reborn(s); len(got) != 1 || got[0] != "old" {
		t.Fatalf("a new file: refund_once reports %q, want old admitted again", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"DELETE FROM schema_migrations WHERE version >= 15",
		"DELETE FROM meta WHERE name = '" + store.MetaForgetsJournaledAfter + "'"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := reborn(s); len(got) != 0 {
		t.Fatalf("upgraded: refund_once reports %q for lives written before the upgrade", got)
	}
	// A third life after the upgrade begins after an ending of before it:
	// clean. A fourth with no forget entry since the third ended is not.
	life(s, "old")
	if got := reborn(s); len(got) != 0 {
		t.Fatalf("upgraded, a life after an old ending: refund_once reports %q", got)
	}
	life(s, "old")
	if got := reborn(s); len(got) != 1 || got[0] != "old" {
		t.Fatalf("upgraded, a life after a new ending with no forget: refund_once reports %q, want old", got)
	}
}
