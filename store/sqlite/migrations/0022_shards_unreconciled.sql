-- capledger schema version 22: the unreconciled shards by generation.
--
-- DrainProgress counts a generation's unreconciled shards on every poll
-- of `capledger rollback --wait`; it read every shard ever issued (those
-- retention has not removed yet). This partial index holds the shards not
-- reconciled by (generation, id): a generation's are one range of it
-- (store.Store.ShardsUnreconciled). A shard enters it when issued and
-- leaves it when reconciled; the migration reads every shard once.
-- The literal 0 is what the reads name.
CREATE INDEX IF NOT EXISTS shards_unreconciled ON shards (generation, id) WHERE reconciled = 0;
