package ledger

import (
	"errors"
	"strings"
)

// The legacy limiter's budget. While a route moves to capledger, the old
// rate limiter keeps deciding for some traffic; it may spend only a budget
// the central ledger carved out for it, and must never hand back a whole
// block of capacity it may have spent.
//
// A legacy budget is an emergency shard in every accounting respect: the
// carve moves its units from available to RetiredForEmergency in one
// command, and the shard row is the budget's own account, in which
// Allocated = Spent + Unknown + Reminted once reconciled (the audit's
// shard_conservation check). That is the seed's equation unchanged:
// capacity handed to a holder outside the central ledger is retired
// (opening + minted + overdraftIssued = available + reserved + spent +
// retired + overdraftRepaid, retired = retiredForEmergency +
// retiredForMove), and only receipts bring part of it back as minted (the
// remint move). What makes it the legacy limiter's, and not a gateway's:
//   - its gateway id is LegacyGateway(identity), the identity of the legacy
//     limiter's token; only that token (or an admin) may reconcile it, and
//     no gateway token can issue one (IssueShard refuses a legacy gateway
//     id without ShardArgs.Legacy, which only the operator's carve sets);
//   - it is carved whatever the deciding policy's emergency mode: no
//     emergency-mode generation is published, so there is no window in
//     which gateways may take shards;
//   - its reconciliation never returns the whole block: a submission
//     after which nothing would be spent and nothing unknown is refused
//     (ErrLegacyWholeBlock), a first one reporting no usage as much as a
//     later one whose settles with no usage resolve the last unknown
//     work, and the audit flags a reconciled legacy budget that reminted
//     its whole allocation (CheckLegacyBudget). An unused budget stays
//     retired, which is safe; carve smaller ones.

// LegacyGatewayPrefix starts the gateway id of every legacy budget.
const LegacyGatewayPrefix = "legacy:"

// LegacyGateway returns the gateway id of the legacy budgets of identity
// (the legacy limiter's token name).
func LegacyGateway(identity string) string { return LegacyGatewayPrefix + identity }

// LegacyIdentity returns the identity a legacy gateway id belongs to, and
// false for another gateway id.
func LegacyIdentity(gatewayID string) (string, bool) {
	return strings.CutPrefix(gatewayID, LegacyGatewayPrefix)
}

// IsLegacyBudget reports whether s is a legacy limiter's budget.
func (s *Shard) IsLegacyBudget() bool {
	_, ok := LegacyIdentity(s.GatewayID)
	return ok
}

// ErrLegacyWholeBlock: a legacy budget's reconciliation would leave no
// usage and no unknown work, which would return its whole allocation.
var ErrLegacyWholeBlock = errors.New("a legacy budget never returns its whole block")

// CheckLegacyBudget is the audit check of legacy budgets: a reconciled
// legacy budget reminted its whole allocation.
const CheckLegacyBudget = "legacy_budget_whole_block"

// legacyWholeBlock reports whether a reconciliation split of shard s
// (spent, unknown) would give back its whole allocation: nothing spent
// and nothing unknown in any dimension of a nonzero allocation.
func legacyWholeBlock(s *Shard, spent, unknown Amounts) bool {
	return s.IsLegacyBudget() && s.Allocated != (Amounts{}) && spent == (Amounts{}) && unknown == (Amounts{})
}
