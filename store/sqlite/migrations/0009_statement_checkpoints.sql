-- capledger schema version 8: statement checkpoints (ledger.Checkpoint).
--
-- A checkpoint summarises the journal up to journal_batches.seq = through:
-- per account, the closing vector of every conservation term and a digest
-- of the entries summarised. Once stored, compaction deletes the journal
-- rows it summarises. Every header is kept (about 300 bytes each); the
-- accounts of the last two checkpoints only.
CREATE TABLE checkpoints (
    seq             INTEGER PRIMARY KEY,
    through         INTEGER NOT NULL,
    cut_at          INTEGER NOT NULL,
    entries         INTEGER NOT NULL,
    moves           INTEGER NOT NULL,
    prev            TEXT    NOT NULL,
    accounts_digest TEXT    NOT NULL,
    digest          TEXT    NOT NULL
);

CREATE TABLE checkpoint_accounts (
    seq        INTEGER NOT NULL,
    subject    TEXT    NOT NULL,
    route      TEXT    NOT NULL,
    region     TEXT    NOT NULL,
    generation INTEGER NOT NULL,
    balances   BLOB    NOT NULL,
    entries    INTEGER NOT NULL,
    journal    TEXT    NOT NULL,
    PRIMARY KEY (seq, subject, route, region, generation)
) WITHOUT ROWID;
