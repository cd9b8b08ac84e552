package sqlite

import (
	"context"
	"database/sql/driver"
	"path/filepath"
	"testing"
)

// The writer leaves checkpoints to the checkpointer up to the backstop,
// and Close stops the checkpointer.
func TestWriterCheckpointsOnlyAsBackstop(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	check, err := s.w.conn.(driver.ConnPrepareContext).PrepareContext(ctx, "PRAGMA wal_autocheckpoint")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := queryOneRow(ctx, s.w, check, nil, scanInt)
	check.Close()
	if err != nil || pages != autocheckpointBackstop {
		t.Fatalf("writer wal_autocheckpoint %d, %v; want %d", pages, err, autocheckpointBackstop)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.checkpointer.done:
	default:
		t.Fatal("Close left the checkpointer running")
	}
}
