-- capledger schema: rollouts (ledger.Rollout), one row per route set.
--
-- body is the rollout's stored form (store/codec EncodeRollout: JSON with
-- its routes, share and whole step history); version is its version, kept
-- as a column so a write can replace exactly the version it read.
CREATE TABLE rollouts (
    name    TEXT    PRIMARY KEY,
    version INTEGER NOT NULL,
    body    BLOB    NOT NULL
) WITHOUT ROWID;
