-- capledger schema version 18: retention of settled emergency shards.
--
-- Retention removes a shard once it is reconciled with nothing left
-- unknown and ended a retention window ago (ledger.RemoveShards);
-- ShardsReconciled reads the candidates through this index of reconciled
-- shards by expiry, so it reads no live or unreconciled shard. The
-- retained shard totals are meta rows (ledger.MetaShardRetainedPrefix).
CREATE INDEX IF NOT EXISTS shards_reconciled ON shards (expires_at, id) WHERE reconciled = 1;
