-- capledger schema version 9: statement checkpoints (ledger.Checkpoint).
--
-- A checkpoint summarises the journal up to journal.seq = through: per
-- account, the closing vector of every conservation term and a digest of
-- the entries summarised. Once stored, compaction deletes the journal rows
-- it summarises (by the primary key, oldest first). Every header is kept;
-- the accounts of the last two checkpoints only.
CREATE TABLE IF NOT EXISTS checkpoints (
    seq             bigint PRIMARY KEY CHECK (seq >= 1),
    through         bigint NOT NULL,
    cut_at          bigint NOT NULL,
    entries         bigint NOT NULL CHECK (entries >= 0),
    moves           bigint NOT NULL CHECK (moves >= 0),
    prev            text   NOT NULL,
    accounts_digest text   NOT NULL,
    digest          text   NOT NULL
);

CREATE TABLE IF NOT EXISTS checkpoint_accounts (
    seq        bigint NOT NULL,
    subject    text   NOT NULL,
    route      text   NOT NULL,
    region     text   NOT NULL,
    generation bigint NOT NULL CHECK (generation >= 0),
    balances   bytea  NOT NULL,
    entries    bigint NOT NULL CHECK (entries >= 0),
    journal    text   NOT NULL,
    PRIMARY KEY (seq, subject, route, region, generation)
);
