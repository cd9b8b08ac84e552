package sqlite

import (
	"context"
	"os"
)

// SetDatasync replaces the store's fdatasync, so a test can count the
// syncs or make one fail.
func SetDatasync(s *Store, f func(*os.File) error) {
	s.sync.mu.Lock()
	defer s.sync.mu.Unlock()
	s.sync.datasync = f
}

// WriterSynchronous returns the write connection's PRAGMA synchronous.
func WriterSynchronous(s *Store) (int64, error) {
	st, err := s.w.stmt(context.Background(), "PRAGMA synchronous")
	if err != nil {
		return 0, err
	}
	return queryOneRow(context.Background(), s.w, st, nil, scanInt)
}
