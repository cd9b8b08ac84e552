package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// abortHalts returns how many constraint checks of query's program end the
// statement with ABORT (a Halt or HaltIfNull with an error code and
// OE_Abort, 2): a statement that writes several rows and may abort that
// way keeps a statement journal, a copy of every page it changes (in a
// temporary file once past 64 KiB), to undo its own earlier rows.
func abortHalts(t *testing.T, s *Store, query string) int {
	t.Helper()
	// Unbound parameters are NULL; EXPLAIN only compiles.
	rows, err := s.readDB.QueryContext(context.Background(), "EXPLAIN "+query, make([]any, 2000)...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var addr, p1, p2, p3, p5 int64
		var opcode string
		var p4, comment any
		if err := rows.Scan(&addr, &opcode, &p1, &p2, &p3, &p4, &p5, &comment); err != nil {
			t.Fatal(err)
		}
		if (opcode == "Halt" || opcode == "HaltIfNull") && p1 != 0 && p2 == 2 {
			n++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMultiRowWritesKeepNoStatementJournal: every multi-row write a batch
// runs (the chunk families of writeSQL, more than one row) fails rather
// than aborts on a constraint, so SQLite keeps no statement journal for
// it. The statements' INSERT used to abort: in an epoch rollover over 1M
// accounts each of its chunks copied the pages it changed into a new
// temporary file (3.5 % of the process's CPU). Nothing is lost by FAIL:
// after a failed statement the Tx rolls back whole.
func TestMultiRowWritesKeepNoStatementJournal(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "journal.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	families := map[string]int{
		"reservations": wReservationRows, "fresh reservations": wFreshReservationRows,
		"fresh shared reservations": wFreshSharedRows, "reservation updates": wReservationUpdateRows,
		"account updates": wAccountUpdateRows, "statements": wStatementRows,
	}
	if len(families) != (nWriteStmts-nBaseStmts)/len(chunkSizes) {
		t.Fatalf("the test covers %d chunk families of %d; add the new one", len(families), (nWriteStmts-nBaseStmts)/len(chunkSizes))
	}
	for name, first := range families {
		for k, size := range chunkSizes {
			if size == 1 {
				continue // one row: nothing of its own to undo, no journal
			}
			if n := abortHalts(t, s, writeSQL[first+k]); n != 0 {
				t.Errorf("%s, %d rows: %d constraint checks abort the statement (a statement journal): %s", name, size, n, shorten(writeSQL[first+k]))
			}
		}
	}
	// The check itself: a plain multi-row INSERT into statements aborts.
	if abortHalts(t, s, "INSERT INTO statements ("+statementCols+") VALUES "+
		fmt.Sprintf("(%s), (%s)", params(9), params(9))) == 0 {
		t.Fatal("a plain multi-row INSERT shows no aborting check: the test would prove nothing")
	}
}

func shorten(q string) string {
	if len(q) > 80 {
		return q[:80] + "..."
	}
	return q
}
