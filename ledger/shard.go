package ledger

import "time"

// Shard is emergencyShard.v1: capacity moved from an account's available
// into RetiredForEmergency while the ledger was healthy, handed to one
// gateway process (identity + boot epoch) to spend while it cannot reach the
// ledger. The gateway's local ledger keeps
// allocated = localAvailable + localReserved + localSpent + localRetired.
type Shard struct {
	ID        string
	Account   AccountKey
	GatewayID string
	// BootEpoch identifies the gateway process; a restarted process has a
	// new one and cannot spend an older process's shard.
	BootEpoch uint64
	// Fence increases with every issuance to the gateway; a shard with an
	// older fence than the newest the gateway holds is dead.
	Fence     uint64
	Allocated Amounts
	IssuedAt  time.Time
	ExpiresAt time.Time
	KeyID     string
	Signature []byte

	// Reconciled is set once the gateway's terminal receipts were accepted.
	Reconciled bool
	// Spent is confirmed used capacity, Unknown is capacity whose usage is
	// still unknown (stays retired until a receipt resolves it), Reminted is
	// confirmed-unused capacity minted back into the active generation.
	Spent    Amounts
	Unknown  Amounts
	Reminted Amounts
}
