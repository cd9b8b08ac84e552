-- capledger schema version 3: the journal of one write is one row.
--
-- Every Write appends its journal entries as one BLOB (format in
-- journal.go: the entries in order, each account key written once per
-- blob) instead of one row per entry in journal, which a batch of 100
-- reserves paid for with 100 rows of 11 bound values. seq is the rowid:
-- insertion order. journal keeps the rows earlier versions wrote (never
-- written again); Snapshot returns them first, then these in seq order.
CREATE TABLE journal_batches (
    seq     INTEGER PRIMARY KEY,
    entries BLOB    NOT NULL
);
