package ledger

import (
	"fmt"
	"strings"
)

// MaxIDBytes bounds the ids a client names: reservation, operation,
// shard, gateway and budget ids.
const MaxIDBytes = 256

// IDProblem says what is wrong with an id a client names, as a phrase
// that follows the field's name ("is required", "is 300 bytes long; at
// most 256", "contains a NUL byte", which the PostgreSQL store cannot
// keep), or "" for a good id. It is the one rule for ids: the server
// refuses such ids at its door (and in ReconcileShard's receipts), and
// ShardLocal.Reserve refuses them as reservation ids, because their
// receipts would make the shard's whole reconciliation refused.
func IDProblem(id string) string {
	switch {
	case strings.IndexByte(id, 0) >= 0:
		return "contains a NUL byte"
	case id == "":
		return "is required"
	case len(id) > MaxIDBytes:
		return fmt.Sprintf("is %d bytes long; at most %d", len(id), MaxIDBytes)
	}
	return ""
}
