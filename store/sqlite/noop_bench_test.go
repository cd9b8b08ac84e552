package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/capledger/capledger/store/sqlite"
)

// BenchmarkPipelinedMaintenanceNothingDue measures one call of statement
// retention with no statement due on a pipelined store (in b.TempDir):
// the call a retention pass ends with, every pass, and the shape of every
// maintenance transaction that finds nothing to do.
//
//	go test -run '^$' -bench PipelinedMaintenanceNothingDue -count 5 ./store/sqlite
func BenchmarkPipelinedMaintenanceNothingDue(b *testing.B) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "capledger.db"), sqlite.WithPipelinedSync())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := tx.Write(ctx, insert("a")); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.StatementsRemove(ctx, t0, 256); err != nil {
			b.Fatal(err)
		}
	}
}
