package ledger

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Audit check names of emergency shards, besides CheckShard (each shard
// account's RetiredForEmergency against its shards, each reconciled
// shard's split).
const (
	// CheckShardRemint: a shard's remint moves add up to more than its
	// confirmed-unused capacity (a duplicate recovery), or a remint move
	// names no shard.
	CheckShardRemint = "shard_remint_once"
	// CheckShardRecord: an unreconciled shard carries a split, two shards
	// of one gateway share a fence, or a shard expires before it was
	// issued.
	CheckShardRecord = "shard_record"
)

// auditShards returns the discrepancies of the shard rows and their remint
// moves (none for a sound ledger):
//   - an unreconciled shard has no spent, unknown or reminted capacity;
//   - the remint moves of each shard mint at most its Reminted, per
//     dimension (less only when the active generation no longer limits a
//     unit), so confirmed-unused capacity came back at most once;
//   - every remint move names a stored shard, or a shard retention
//     removed from its source account: those moves are as many as the
//     account's retained shard totals count, and mint at most their
//     Reminted, per dimension;
//   - fences are unique per gateway, and every shard expires after it was
//     issued.
func auditShards(s *Snapshot) []Discrepancy {
	var out []Discrepancy
	add := func(check string, account AccountKey, format string, args ...any) {
		out = append(out, Discrepancy{Check: check, Account: account.String(), Detail: fmt.Sprintf(format, args...)})
	}
	shards := make(map[string]*Shard, len(s.Shards))
	type fenceKey struct {
		gateway string
		fence   uint64
	}
	fences := map[fenceKey]string{}
	for i := range s.Shards {
		sh := &s.Shards[i]
		shards[sh.ID] = sh
		if !sh.Reconciled && (sh.Spent != Amounts{} || sh.Unknown != Amounts{} || sh.Reminted != Amounts{}) {
			add(CheckShardRecord, sh.Account, "shard %s is not reconciled but records spent %v, unknown %v, reminted %v", sh.ID, sh.Spent, sh.Unknown, sh.Reminted)
		}
		if sh.Reconciled && legacyWholeBlock(sh, sh.Spent, sh.Unknown) {
			add(CheckLegacyBudget, sh.Account, "legacy budget %s of %s returned its whole allocation %v: nothing reported spent or unknown", sh.ID, sh.GatewayID, sh.Allocated)
		}
		if !sh.ExpiresAt.After(sh.IssuedAt) {
			add(CheckShardRecord, sh.Account, "shard %s expires at %s, not after its issuance at %s", sh.ID, sh.ExpiresAt, sh.IssuedAt)
		}
		k := fenceKey{sh.GatewayID, sh.Fence}
		if other, dup := fences[k]; dup {
			add(CheckShardRecord, sh.Account, "shards %s and %s of gateway %s share fence %d", other, sh.ID, sh.GatewayID, sh.Fence)
		}
		fences[k] = sh.ID
	}
	retained := make(map[AccountKey]*RetainedShards, len(s.RetainedShards))
	for i := range s.RetainedShards {
		retained[s.RetainedShards[i].Account] = &s.RetainedShards[i]
	}
	type orphan struct {
		moves int64
		units Amounts
	}
	orphans := map[AccountKey]orphan{}
	reminted := map[string]Amounts{}
	for i := range s.Moves {
		m := &s.Moves[i]
		if m.Kind != MoveShardRemint {
			continue
		}
		id, ok := ShardOfRemint(m.ReceiptID)
		if ok && !remintOf(m, shards[id]) && retained[m.From] != nil {
			// A removed shard's move: checked against its account's
			// retained shard totals below.
			o := orphans[m.From]
			o.moves++
			for d := range o.units {
				o.units[d] += m.Units[d]
			}
			orphans[m.From] = o
			continue
		}
		if !ok || !remintOf(m, shards[id]) {
			add(CheckShardRemint, m.To, "remint move %s names no stored shard", m.ReceiptID)
			continue
		}
		sum := reminted[id]
		for d := range sum {
			sum[d] += m.Units[d]
		}
		reminted[id] = sum
	}
	for id, sum := range reminted {
		sh := shards[id]
		for d := range sum {
			if sum[d] > sh.Reminted[d] {
				add(CheckShardRemint, sh.Account, "shard %s %s: remint moves minted %d, the shard confirmed %d unused",
					id, dimensionName(snapshotPolicy(s, sh.Account.Generation), d), sum[d], sh.Reminted[d])
			}
		}
	}
	for i := range s.RetainedShards {
		rs := &s.RetainedShards[i]
		o := orphans[rs.Account]
		if o.moves != rs.Remints {
			add(CheckShardRemint, rs.Account, "%d remint moves name removed shards of the account, whose %d removed shards made %d",
				o.moves, rs.Shards, rs.Remints)
		}
		for d := range o.units {
			if o.units[d] > rs.Reminted[d] {
				add(CheckShardRemint, rs.Account, "removed shards %s: remint moves minted %d, the shards confirmed %d unused",
					dimensionName(snapshotPolicy(s, rs.Account.Generation), d), o.units[d], rs.Reminted[d])
			}
		}
	}
	return out
}

// snapshotPolicy returns generation's policy in s, or nil (also when
// PoliciesOf fails: it names a dimension in a discrepancy's detail).
func snapshotPolicy(s *Snapshot, generation uint64) *Policy {
	if s.PoliciesOf != nil {
		if found, err := s.PoliciesOf([]uint64{generation}); err == nil {
			if p, ok := found[generation]; ok {
				return &p
			}
		}
		return nil
	}
	for i := range s.Policies {
		if s.Policies[i].Generation == generation {
			return &s.Policies[i]
		}
	}
	return nil
}

// ShardOfRemint returns the shard id of a ShardRemintReceipt (or
// LegacyShardRemintReceipt) id.
func ShardOfRemint(receiptID string) (string, bool) {
	rest, ok := strings.CutPrefix(receiptID, "shard-remint:")
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return "", false
	}
	return rest[:i], true
}

// legacyRemintSkew is how far a legacy remint move's time may fall before
// its shard's issuance: the replica that reconciled may have a clock
// behind the one that issued (PostgreSQL replicas each read their own),
// so a shard reconciled within that of its issuance must still own its
// moves. Retention windows are far longer, so a removed shard's moves
// stay before it.
const legacyRemintSkew = time.Minute

// remintOf reports whether remint move m is one of stored shard sh's
// (false for a nil sh): its receipt carries sh's issue time. A move
// under sh's id with another issue time is a shard's that retention
// removed before sh was issued under the same id. A legacy receipt
// (without the issue time) is sh's when it was made no earlier than
// legacyRemintSkew before sh's issuance: a removed shard's moves all came
// before its removal, a retention window after it ended, and the id was
// free for sh only after that.
func remintOf(m *Move, sh *Shard) bool {
	if sh == nil {
		return false
	}
	issued, marked := ShardRemintIssued(m.ReceiptID)
	if !marked {
		return !m.At.Before(sh.IssuedAt.Add(-legacyRemintSkew))
	}
	return issued == sh.IssuedAt.UnixNano()
}

// ShardRemintIssued returns the issue time, in Unix nanoseconds, that a
// ShardRemintReceipt id carries, and false for a LegacyShardRemintReceipt
// (no issue time). A malformed time is -1, no shard's.
func ShardRemintIssued(receiptID string) (int64, bool) {
	tail := receiptID[strings.LastIndexByte(receiptID, ':')+1:]
	issued, _, marked := strings.Cut(tail, ".")
	if !marked {
		return 0, false
	}
	n, err := strconv.ParseInt(issued, 10, 64)
	if err != nil {
		return -1, true
	}
	return n, true
}
