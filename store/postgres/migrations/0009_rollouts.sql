-- capledger schema: rollouts (ledger.Rollout), one row per route set.
--
-- body is the rollout's stored form (store/codec EncodeRollout: JSON with
-- its routes, share and whole step history); version is its version, kept
-- as a column so a write can replace exactly the version it read.
CREATE TABLE IF NOT EXISTS rollouts (
    name    text   PRIMARY KEY,
    version bigint NOT NULL CHECK (version > 0),
    body    bytea  NOT NULL
);
