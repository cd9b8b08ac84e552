package client

// The end-to-end shard helpers of shard_e2e_test.go, for this package's
// external tests: those that run `capledger serve` replicas on PostgreSQL
// through internal/replicatest, which imports this package and so cannot
// be imported by its internal tests.
var (
	Heal                  = heal
	NewPartitionedGateway = newPartitionedGateway
	PublishTenantPolicy   = publishTenantPolicy
	NoBreakerWatchdog     = noBreakerWatchdog
	Spread                = spread
)

// OfflineTimeout bounds the calls an external test makes while a proxy
// cuts its gateway off (offlineTimeout).
const OfflineTimeout = offlineTimeout

// ByPath routes ReconcileShard calls through one transport and the rest
// through another (byPath).
type ByPath = byPath
