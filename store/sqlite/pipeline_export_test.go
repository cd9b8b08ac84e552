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

// SetCommitFault makes every COMMIT of an engine transaction that worked
// answer f's error (nil f: none), as a COMMIT whose outcome is unknown.
func SetCommitFault(s *Store, f func() error) {
	if f == nil {
		s.commitFault.Store(nil)
		return
	}
	s.commitFault.Store(&f)
}

// SetSubjectFlushFault makes every subject index flush and catch-up
// transaction fail with err (nil: none).
func SetSubjectFlushFault(s *Store, err error) {
	if err == nil {
		s.subjects.fault.Store(nil)
		return
	}
	s.subjects.fault.Store(&err)
}

// SubjectIndexCatchingUp reports whether the subject index waits for a
// catch-up from the journal.
func (s *Store) SubjectIndexCatchingUp() bool { return s.subjects.catchUp.Load() }

// SubjectIndexThrough reads the watermark subject_index_through.
func (s *Store) SubjectIndexThrough(ctx context.Context) (int64, error) {
	var n int64
	err := s.readDB.QueryRowContext(ctx, "SELECT value FROM meta WHERE name = ?", subjectIndexMeta).Scan(&n)
	return n, err
}

// SetSubjectReadDone makes f run once a subject listing has read, before
// it decides whether the index was catching up (nil f: none).
func SetSubjectReadDone(s *Store, f func()) {
	if f == nil {
		s.subjects.readDone.Store(nil)
		return
	}
	s.subjects.readDone.Store(&f)
}
