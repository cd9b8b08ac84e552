package postgres

// The shard retention reads, for the plan test.
var (
	ShardsReconciledSQL      = sqlShardsReconciled
	ShardsReconciledAfterSQL = sqlShardsReconciledAfter
	MetaNamesSQL             = sqlMetaNames
	MetaPrefixSQL            = sqlMetaPrefix
	ShardFencesIdleSQL       = sqlShardFencesIdle
)
