package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// walPages returns the page numbers of the frames in the WAL file at path
// (32-byte header, then frames of a 24-byte header and a page).
func walPages(t *testing.T, path string, pageSize int) []uint32 {
	t.Helper()
	b, err := os.ReadFile(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	var pages []uint32
	for off := 32; off+24+pageSize <= len(b); off += 24 + pageSize {
		pages = append(pages, binary.BigEndian.Uint32(b[off:]))
	}
	return pages
}

// TestAccountWriteKeepsTheEpochIndex checks that writing an account this
// transaction read leaves the pages of the accounts_by_epoch index alone,
// its epoch unchanged or rolled from a busy one (SQLite rewrites an index
// on every UPDATE naming one of its columns, so the upsert wrote a second
// random page per account), while a blind write and the roll of an idle
// epoch still move the entry. AccountsByEpoch finds the busy roll at its
// old place until EpochIndexCatchUp moves it, within a bound only by its
// new epoch, and then under its new epoch.
func TestAccountWriteKeepsTheEpochIndex(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	account := func(i int, epochStart time.Time, available ledger.Units) ledger.Account {
		return ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%05d", i), Route: "chat", Region: "eu", Generation: 1},
			Dims: 1, EpochStart: epochStart, Balances: ledger.Balances{{Opening: 1000, Available: available}}}
	}
	// Enough accounts that the table and the index span many pages.
	all := make([]ledger.Account, 3000)
	for i := range all {
		all[i] = account(i, epoch, 1000)
	}
	commit := func(read bool, a ledger.Account) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if read {
			if _, err := tx.AccountGet(ctx, a.Key); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{a}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: all}); err != nil {
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
	db.SetMaxOpenConns(1)
	var pageSize int
	if err := db.QueryRow("PRAGMA page_size").Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	// indexPagesWritten empties the WAL, runs one commit and reports
	// whether its frames hold a page of the index.
	indexPagesWritten := func(read bool, a ledger.Account) bool {
		t.Helper()
		for busy, tries := 1, 0; busy != 0; tries++ {
			if tries == 1000 {
				t.Fatal("the WAL checkpoint stayed busy")
			}
			var log, done int
			if err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &log, &done); err != nil {
				t.Fatal(err)
			}
			if busy != 0 {
				time.Sleep(10 * time.Millisecond) // the store's checkpointer runs one
			}
		}
		commit(read, a)
		rows, err := db.Query("SELECT pageno FROM dbstat WHERE name = 'accounts_by_epoch'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var index []uint32
		for rows.Next() {
			var p uint32
			if err := rows.Scan(&p); err != nil {
				t.Fatal(err)
			}
			index = append(index, p)
		}
		if len(index) < 3 {
			t.Fatalf("the index has %d pages; the test needs more", len(index))
		}
		written := walPages(t, path, pageSize)
		if len(written) == 0 {
			t.Fatal("the commit wrote no WAL frame")
		}
		for _, p := range written {
			if slices.Contains(index, p) {
				return true
			}
		}
		return false
	}

	if indexPagesWritten(true, account(1500, epoch, 900)) {
		t.Error("a read account written with its epoch unchanged rewrote the epoch index")
	}
	if !indexPagesWritten(false, account(1501, epoch, 900)) {
		t.Error("a blind write did not go through the upsert (the check above would prove nothing)")
	}
	next := epoch.Add(time.Hour)
	if indexPagesWritten(true, account(1502, next, 800)) {
		t.Error("a busy epoch rolled rewrote the epoch index")
	}
	// An idle epoch: nothing changed in it (EpochOpening = Balances).
	idle := account(1503, epoch, 1000)
	idle.EpochOpening = idle.Balances
	commit(false, idle)
	idle.EpochStart = next
	idle.Balances[0].Available = 700
	if !indexPagesWritten(true, idle) {
		t.Error("an idle epoch rolled did not move the account's entry of the epoch index")
	}
	for i, want := range map[int]ledger.Units{1500: 900, 1501: 900, 1502: 800, 1503: 700, 1504: 1000} {
		got, err := s.AccountGet(ctx, account(i, epoch, 0).Key)
		if err != nil || got.Balances[0].Available != want {
			t.Errorf("account %d: available %d, %v; want %d", i, got.Balances[0].Available, err, want)
		}
	}
	subjects := func(list []ledger.Account) []string {
		var out []string
		for _, a := range list {
			out = append(out, a.Key.Subject)
		}
		return out
	}
	afterFirst := store.EpochFilter{Generation: 1, Limit: 10, After: store.EpochCursor{EpochStart: epoch, Subject: "tenant-99999"}}
	rolled, _, err := s.AccountsByEpoch(ctx, afterFirst)
	if err != nil {
		t.Fatal(err)
	}
	if got := subjects(rolled); !slices.Equal(got, []string{"tenant-01503"}) {
		t.Errorf("accounts after the first epoch before the catch-up: %v; want tenant-01503", got)
	}
	// The busy roll's entry is still among the first epoch's, after
	// tenant-01501; a bound at the first epoch leaves it out.
	page, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 1, Limit: 3, After: store.EpochCursor{EpochStart: epoch, Subject: "tenant-01500", Route: "chat", Region: "eu"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := subjects(page); !slices.Equal(got, []string{"tenant-01501", "tenant-01502", "tenant-01504"}) {
		t.Errorf("accounts after tenant-01500: %v; want 01501, 01502 (at its old place), 01504", got)
	}
	page, _, err = s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 1, StartedBy: epoch, Limit: 2, After: store.EpochCursor{EpochStart: epoch, Subject: "tenant-01500", Route: "chat", Region: "eu"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := subjects(page); !slices.Equal(got, []string{"tenant-01501", "tenant-01504"}) {
		t.Errorf("accounts after tenant-01500 due by the first epoch: %v; want 01501, 01504", got)
	}

	// The catch-up over the first epoch moves the entry, and only in its
	// chunk that holds it.
	lagging := func() int {
		t.Helper()
		var n int
		if err := db.QueryRow("SELECT count(*) FROM accounts WHERE epoch_indexed < epoch_start").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := lagging(); n != 1 {
		t.Fatalf("%d entries lag their epoch before the catch-up; want 1", n)
	}
	var chunks, moved int
	f := store.EpochFilter{Generation: 1, StartedBy: epoch, Limit: 500}
	for {
		before := lagging()
		cursor, more, err := s.EpochIndexCatchUp(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		chunks++
		if lagging() < before {
			moved++
		}
		if !more {
			break
		}
		f.After = cursor
	}
	if chunks != 6 || moved != 1 || lagging() != 0 {
		t.Errorf("catch-up: %d chunks, %d of them moved an entry, %d lag; want 6 (2,999 entries in chunks of 500), 1, 0", chunks, moved, lagging())
	}
	rolled, _, err = s.AccountsByEpoch(ctx, afterFirst)
	if err != nil {
		t.Fatal(err)
	}
	if got := subjects(rolled); !slices.Equal(got, []string{"tenant-01502", "tenant-01503"}) || !rolled[0].EpochStart.Equal(next) {
		t.Errorf("accounts after the first epoch after the catch-up: %v; want tenant-01502 and 01503 at %s", got, next)
	}
}

// TestAccountWritesInChunks checks the multi-row short UPDATE of accounts
// (71 = 64 + 4 + 2 + 1 rows in one Write): every account gets its own
// values, an account whose busy epoch rolled goes with them and is found
// under its new epoch once EpochIndexCatchUp moved its entry, and a key
// given twice ends as its last copy.
func TestAccountWritesInChunks(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	next := epoch.Add(time.Hour)
	var all []ledger.Account
	for i := range 71 {
		all = append(all, ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%05d", i), Route: "chat", Region: "eu", Generation: 1},
			Dims: 1, EpochStart: epoch, Balances: ledger.Balances{{Opening: 1000, Available: 1000}}, Version: 1})
	}
	writeTx(t, s, &store.Changes{Accounts: all})
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var want []ledger.Account
	for i := range all {
		a, err := tx.AccountGet(ctx, all[i].Key)
		if err != nil {
			t.Fatal(err)
		}
		a.Balances[0].Available -= ledger.Units(i)
		a.Balances[0].Reserved += ledger.Units(i)
		a.Breaches, a.Version = int64(i%3), a.Version+uint64(i)
		if i == 10 {
			a.EpochStart, a.EpochOpening = next, a.Balances
		}
		want = append(want, *a)
	}
	twice := want[20]
	twice.Balances[0].Available, twice.Version = 1, 99
	rows := append(append(append([]ledger.Account(nil), want[:21]...), twice), want[21:]...)
	if err := tx.Write(ctx, &store.Changes{Accounts: rows}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want[20] = twice
	for _, w := range want {
		got, err := s.AccountGet(ctx, w.Key)
		if err != nil {
			t.Fatal(err)
		}
		if got.Balances != w.Balances || !got.EpochStart.Equal(w.EpochStart) || got.EpochOpening != w.EpochOpening ||
			got.Breaches != w.Breaches || got.Version != w.Version {
			t.Errorf("account %s stored\n%+v\nwant\n%+v", w.Key, got, w)
		}
	}
	// tenant-00010's epoch rolled from a busy one: its entry of the epoch
	// index stays among the first epoch's until the catch-up.
	if _, _, err := s.EpochIndexCatchUp(ctx, store.EpochFilter{Generation: 1, StartedBy: epoch, Limit: 100}); err != nil {
		t.Fatal(err)
	}
	rolled, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 1, Limit: 10, After: store.EpochCursor{EpochStart: epoch, Subject: "tenant-99999"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rolled) != 1 || rolled[0].Key.Subject != "tenant-00010" {
		t.Errorf("accounts after the first epoch: %+v; want tenant-00010 alone", rolled)
	}
}

// TestStatementsInChunks: a batch's statements go in multi-row INSERTs
// (64, then the smaller chunk sizes); every column of every statement
// reads back as written, in the order written.
func TestStatementsInChunks(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := ledger.AccountKey{Subject: "tenant-1", Route: "chat", Region: "eu", Generation: 3}
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	var want []ledger.Statement
	for i := range 71 { // 64 + 4 + 2 + 1
		want = append(want, ledger.Statement{Account: key, Dims: 2,
			EpochStart: epoch.Add(time.Duration(i) * time.Hour), EpochEnd: epoch.Add(time.Duration(i+1) * time.Hour),
			Opening: ledger.Balances{{Opening: ledger.Units(i), Available: 7}, {Opening: 2, Reserved: ledger.Units(i)}},
			Closing: ledger.Balances{{Opening: ledger.Units(i), Available: 5}, {Opening: 2, Spent: ledger.Units(i) + 1}}})
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Statements: want}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.StatementsOf(ctx, store.StatementFilter{Account: key, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b ledger.Statement) int { return a.EpochStart.Compare(b.EpochStart) })
	if len(got) != len(want) {
		t.Fatalf("%d statements read back, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Account != w.Account || !g.EpochStart.Equal(w.EpochStart) || !g.EpochEnd.Equal(w.EpochEnd) || g.Dims != w.Dims ||
			g.Opening != w.Opening || g.Closing != w.Closing {
			t.Fatalf("statement %d read back as %+v, want %+v", i, g, w)
		}
	}
}

// TestDuplicateStatementRollsBackTheBatch: a chunk of statements (INSERT OR
// FAIL) that repeats an account's epoch fails the Write, and nothing of the
// transaction is stored, not even the chunk's rows before the duplicate.
func TestDuplicateStatementRollsBackTheBatch(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	key := ledger.AccountKey{Subject: "tenant-1", Route: "chat", Region: "eu", Generation: 3}
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	var sts []ledger.Statement
	for i := range 4 {
		sts = append(sts, ledger.Statement{Account: key, Dims: 1, EpochStart: epoch.Add(time.Duration(i) * time.Hour),
			EpochEnd: epoch.Add(time.Duration(i+1) * time.Hour)})
	}
	sts = append(sts, sts[2])       // 5 rows: a chunk of 4 and one
	sts[3], sts[4] = sts[4], sts[3] // the duplicate inside the chunk of 4
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Statements: sts}); err == nil {
		t.Error("a duplicate statement was written")
	}
	if err := tx.Commit(ctx); err == nil {
		t.Error("the transaction committed after a failed Write")
	}
	got, err := s.StatementsOf(ctx, store.StatementFilter{Account: key, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("%d statements stored after the failed transaction, want 0", len(got))
	}
}
