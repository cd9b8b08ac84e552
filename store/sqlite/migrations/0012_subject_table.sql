-- capledger schema version 12: the console's subject index becomes a table
-- the store fills behind the commits (subjectindex.go).
--
-- Version 11's automatic index reservations_by_subject made every reserve
-- write a random leaf of it (and the checkpointer copy that leaf): over a
-- million subjects, one of the two random page writes a reserve paid for
-- and one subject did not. reservation_subjects holds the same keys, but
-- a commit does not write it: the store keeps a reserve's entry in memory
-- and inserts entries in key order, many per leaf, a while later. The meta
-- row subject_index_through is the journal_batches seq up to which the
-- table holds every kept reservation; Open rebuilds the entries of the
-- batches after it (a process killed before its flush).
DROP INDEX reservations_by_subject;
CREATE TABLE reservation_subjects (
    subject    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    id         TEXT    NOT NULL,
    PRIMARY KEY (subject, created_at, id)
) WITHOUT ROWID;
INSERT INTO reservation_subjects (subject, created_at, id)
    SELECT subject, created_at, id FROM reservations ORDER BY subject, created_at, id;
INSERT OR REPLACE INTO meta (name, value)
    SELECT 'subject_index_through', COALESCE(MAX(seq), 0) FROM journal_batches;
