package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// fillAndRetire writes n finished reservations and removes them through
// the ledger's retire command, as the retention worker does.
func fillAndRetire(t *testing.T, s *Store, n int) {
	t.Helper()
	fillRetireForget(t, s, n, false)
}

// fillRetireForget is fillAndRetire, then, when forget is set, the
// tombstones' removal (the ledger's forget command).
func fillRetireForget(t *testing.T, s *Store, n int, forget bool) {
	t.Helper()
	ctx := context.Background()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	key := ledger.PolicyKey{Subject: "tenant-v", Route: "chat", Region: "eu"}
	policy := ledger.Policy{Key: key, HoldTTL: time.Minute,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 40, RefillUnits: 1, RefillInterval: time.Second}}}.WithDefaults()
	batch := func(cmds []ledger.Command) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		book := store.NewBook(ctx, tx, len(cmds))
		for i := range cmds {
			if res := ledger.Apply(book, &cmds[i], now); res.Err != nil {
				t.Fatalf("%s %s: %v", cmds[i].Kind, cmds[i].ReservationID, res.Err)
			}
		}
		if err := tx.Write(ctx, book.Changes()); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	batch([]ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &policy}})
	for start := 0; start < n; start += 500 {
		var cmds []ledger.Command
		for i := start; i < start+500 && i < n; i++ {
			id := fmt.Sprintf("vac-%07d-%s", i, "padding-to-make-rows-realistic")
			cmds = append(cmds, ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
				Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{10}},
				ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
		}
		batch(cmds)
	}
	for start := 0; start < n; start += 500 {
		var cmds []ledger.Command
		for i := start; i < start+500 && i < n; i++ {
			cmds = append(cmds, ledger.Command{Kind: ledger.KindRetire, ReservationID: fmt.Sprintf("vac-%07d-%s", i, "padding-to-make-rows-realistic"), Before: now})
		}
		batch(cmds)
	}
	for start := 0; forget && start < n; start += 500 {
		var cmds []ledger.Command
		for i := start; i < start+500 && i < n; i++ {
			cmds = append(cmds, ledger.Command{Kind: ledger.KindForget, ReservationID: fmt.Sprintf("vac-%07d-%s", i, "padding-to-make-rows-realistic"), Before: now})
		}
		batch(cmds)
	}
}

// A new file is INCREMENTAL, and Reclaim gives the pages retention freed
// back: the freelist shrinks and so does the file.
func TestReclaimGivesFreedPagesBack(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "vac.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if mode, err := s.AutoVacuum(ctx); err != nil || mode != AutoVacuumIncremental {
		t.Fatalf("auto_vacuum of a new file: %d, %v", mode, err)
	}
	fillAndRetire(t, s, 5000)
	free, total, err := s.FreePages(ctx)
	if err != nil || free < 50 {
		t.Fatalf("after retention: %d free of %d pages, %v", free, total, err)
	}
	if err := s.Reclaim(ctx); err != nil {
		t.Fatal(err)
	}
	free2, total2, err := s.FreePages(ctx)
	if err != nil || free2 != 0 || total2 >= total {
		t.Fatalf("after reclaim: %d free of %d pages (before %d of %d), %v", free2, total2, free, total, err)
	}
}

// A file created before auto_vacuum was set converts once, keeping its
// rows.
func TestConvertAutoVacuum(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE legacy_marker (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if mode, _ := s.AutoVacuum(ctx); mode != AutoVacuumNone {
		t.Fatalf("old file has mode %d", mode)
	}
	fillAndRetire(t, s, 1000)
	before, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(ctx, path, WithAutoVacuumConversion())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if mode, _ := s.AutoVacuum(ctx); mode != AutoVacuumIncremental {
		t.Fatalf("after conversion: mode %d", mode)
	}
	after, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Retained) != 1 || after.Retained[0] != before.Retained[0] || len(after.Accounts) != len(before.Accounts) {
		t.Fatalf("rows changed by the conversion: %+v -> %+v", before.Retained, after.Retained)
	}
	if free, _, _ := s.FreePages(ctx); free != 0 {
		t.Fatalf("%d free pages after VACUUM", free)
	}
}

// ReclaimStep, the workers' step, gives pages back a bounded step at a
// time and stops at a reserve of an eighth of the file for reuse.
func TestReclaimStepKeepsAReserve(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "vac.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fillRetireForget(t, s, 5000, true)
	free, total, err := s.FreePages(ctx)
	if err != nil || free < 4*(total/reclaimReserve) {
		t.Fatalf("after retention: %d free of %d pages, %v; the test needs more", free, total, err)
	}
	if _, err := s.ReclaimStep(ctx, 0); err == nil {
		t.Fatal("ReclaimStep of 0 pages: no error")
	}
	steps := 0
	for more := true; more; steps++ {
		if more, err = s.ReclaimStep(ctx, 10); err != nil {
			t.Fatal(err)
		}
		f, _, _ := s.FreePages(ctx)
		if f < free-10 {
			t.Fatalf("one step of 10 pages freed %d -> %d", free, f)
		}
		free = f
	}
	free, total, err = s.FreePages(ctx)
	if err != nil || free == 0 || free > total/reclaimReserve+1 || steps < 2 {
		t.Fatalf("after the steps: %d free of %d pages (reserve %d), %d steps, %v", free, total, total/reclaimReserve, steps, err)
	}
	if more, err := s.ReclaimStep(ctx, 10); more || err != nil {
		t.Fatalf("at the reserve: more %v, %v", more, err)
	}
}
