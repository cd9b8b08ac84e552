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

// FlushSubjectIndex writes every pending subject index entry
// (subjectindex.go) now.
func (s *Store) FlushSubjectIndex(ctx context.Context) error { return s.flushSubjects(ctx) }

// SubjectIndexPending is how many subject index entries are pending.
func (s *Store) SubjectIndexPending() int { return s.subjects.len() }
