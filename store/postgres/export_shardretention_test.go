package postgres

// The shard retention reads, for the plan test.
var (
	ShardsReconciledSQL      = sqlShardsReconciled
	ShardsReconciledAfterSQL = sqlShardsReconciledAfter
	ShardsUnreconciledSQL    = sqlShardsUnreconciled
	MetaNamesSQL             = sqlMetaNames
	MetaPrefixSQL            = sqlMetaPrefix
	ShardFencesIdleSQL       = sqlShardFencesIdle
)
