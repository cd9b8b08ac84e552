package ledger

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Retention of emergency shards: a shard that nothing can change any more
// leaves the store a retention window after it ended, with its meta rows,
// and its totals are folded into its account's retained shard totals
// (RetainedShards), so the audit's shard checks still add up.
//
// A shard is settled (ShardSettled) once it is reconciled, none of its
// capacity is left unknown, and none of its receipts was left unknown
// (a receipt reported STARTED or USAGE_UNKNOWN may hold no units, so
// Unknown alone does not tell): ReconcileShard then refuses every later
// submission (it needs a receipt left pending), IssueShard only replays
// or refuses the id, and the fence is the gateway's fence row's, not the
// shard row's. Nothing but retention writes a settled shard again. A
// reconciled shard still holding unknown work is kept: a later settled
// receipt moves capacity out of Unknown.

// RetainedShards totals what retention removed of one account's shards:
// how many, how many remint moves they made (each move row stays, naming
// a shard no longer stored), and their allocated, spent and reminted
// capacity. Removed shards held nothing unknown, so Spent + Reminted =
// Allocated in every dimension.
type RetainedShards struct {
	Account   AccountKey
	Shards    int64
	Remints   int64
	Allocated Amounts
	Spent     Amounts
	Reminted  Amounts
}

// MetaShardRetainedPrefix begins the Meta names of the retained shard
// totals: one counter per account and term (metaShardRetained), so
// every store keeps them in its meta rows, locked and written like any
// counter, and its audit snapshot reads them by this prefix
// (ParseRetainedShards).
const MetaShardRetainedPrefix = "shard_retained/"

// Terms of a RetainedShards row in its Meta names.
const (
	retainedShardsCount     = "shards"
	retainedShardsRemints   = "remints"
	retainedShardsAllocated = "allocated"
	retainedShardsSpent     = "spent"
	retainedShardsReminted  = "reminted"
)

// metaShardRetained names one term of an account's retained shard totals
// (d < 0: a term without dimension).
func metaShardRetained(k AccountKey, term string, d int) string {
	name := MetaShardRetainedPrefix + metaNamePart(k.Subject) + "/" + metaNamePart(k.Route) + "/" + metaNamePart(k.Region) + "/" +
		strconv.FormatUint(k.Generation, 10) + "/" + term
	if d >= 0 {
		name += "/" + strconv.Itoa(d)
	}
	return name
}

// unescapeMetaNamePart reverses metaNamePart.
func unescapeMetaNamePart(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	return strings.NewReplacer("%2F", "/", "%25", "%").Replace(s)
}

// SortedRetainedShards lists the totals ParseRetainedShards gathered, in
// account key order, as a Snapshot holds them.
func SortedRetainedShards(by map[AccountKey]*RetainedShards) []RetainedShards {
	var out []RetainedShards
	for _, k := range slices.SortedFunc(maps.Keys(by), AccountKey.Compare) {
		out = append(out, *by[k])
	}
	return out
}

// ParseRetainedShards adds the counter name = value to the retained shard
// totals in into (by account), and reports whether name is one of them
// (MetaShardRetainedPrefix and a well-formed rest). A store's snapshot
// calls it for every meta row under the prefix.
func ParseRetainedShards(into map[AccountKey]*RetainedShards, name string, value int64) bool {
	rest, ok := strings.CutPrefix(name, MetaShardRetainedPrefix)
	if !ok {
		return false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 && len(parts) != 6 {
		return false
	}
	gen, err := strconv.ParseUint(parts[3], 10, 64)
	if err != nil {
		return false
	}
	k := AccountKey{Subject: unescapeMetaNamePart(parts[0]), Route: unescapeMetaNamePart(parts[1]),
		Region: unescapeMetaNamePart(parts[2]), Generation: gen}
	d := -1
	if len(parts) == 6 {
		if d, err = strconv.Atoi(parts[5]); err != nil || d < 0 || d >= MaxDimensions {
			return false
		}
	}
	r := into[k]
	if r == nil {
		r = &RetainedShards{Account: k}
	}
	switch {
	case d < 0 && parts[4] == retainedShardsCount:
		r.Shards = value
	case d < 0 && parts[4] == retainedShardsRemints:
		r.Remints = value
	case d >= 0 && parts[4] == retainedShardsAllocated:
		r.Allocated[d] = value
	case d >= 0 && parts[4] == retainedShardsSpent:
		r.Spent[d] = value
	case d >= 0 && parts[4] == retainedShardsReminted:
		r.Reminted[d] = value
	default:
		return false
	}
	into[k] = r
	return true
}

// ShardRemover is what RemoveShards needs of a Book: the shard rows,
// with removal, the remint moves, and the meta counters, with removal.
type ShardRemover interface {
	MetaRemover
	Shard(id string) (*Shard, bool)
	Move(receiptID string) (*Move, bool)
	// ShardRemove deletes a shard row; Shard then answers false.
	ShardRemove(id string)
}

// ShardSettled reports whether a shard is reconciled with nothing left
// unknown in its capacity. It is the index a store's ShardsReconciled
// reads narrowed by the row; RemoveShards also checks that no receipt
// is left pending.
func ShardSettled(s *Shard) bool { return s.Reconciled && s.Unknown == (Amounts{}) }

// ShardEnded returns when a settled shard ended: its expiry, or its last
// remint move when that is later (a reconciliation after the expiry),
// so a retry of a reconciliation whose answer was lost finds the shard
// for at least the retention window after it reminted.
func ShardEnded(b ShardRemover, s *Shard) time.Time {
	ended := s.ExpiresAt
	if n := b.Meta(metaShardMoves(s.ID)); n > 0 {
		m, ok := b.Move(ShardRemintReceipt(s, n))
		if !ok { // reminted before receipts carried the issue time
			m, ok = b.Move(LegacyShardRemintReceipt(s.ID, n))
		}
		if ok && m.At.After(ended) {
			ended = m.At
		}
	}
	return ended
}

// ShardUnknownPrefix is the prefix of the Meta names of a shard's
// receipts left unknown (and their held units): the names the caller of
// RemoveShards lists, per shard, for it to check and remove.
func ShardUnknownPrefix(shardID string) string { return "shard_unknown/" + metaNamePart(shardID) + "/" }

// ownUnknownName reports whether name is one of shardID's receipt
// counters: its prefix, then an escaped receipt id (no "/"), then at
// most a dimension. Names written before the ids were escaped (see
// metaShardPending) may look like another shard's and are left alone.
func ownUnknownName(shardID, name string) (units bool, ok bool) {
	rest, found := strings.CutPrefix(name, ShardUnknownPrefix(shardID))
	if !found || rest == "" {
		return false, false
	}
	receipt, dim, hasDim := strings.Cut(rest, "/")
	if receipt == "" {
		return false, false
	}
	if !hasDim {
		return false, true
	}
	if d, err := strconv.Atoi(dim); err != nil || d < 0 || d >= MaxDimensions || strconv.Itoa(d) != dim {
		return false, false
	}
	return true, true
}

// RemoveShards removes the shards ids that are settled and ended at or
// before before, with their meta rows (metaShardMoves,
// MetaShardRefusedFor, and the receipt counters unknown[id] lists under
// ShardUnknownPrefix), folding each into its account's retained shard
// totals. A shard is left alone (and not counted) when it is missing, not
// settled, ended after before, has a receipt still pending (left unknown
// with no units held), or its record is one the audit would report (a
// split that does not add up, a legacy budget returned whole): the audit
// keeps reading it. Safe in any interleaving with reconciliations and
// with another replica removing the same shards: the caller's book reads
// (and locks) each row it changes in the transaction that removes it. It
// returns how many shards it removed.
func RemoveShards(b ShardRemover, ids []string, before time.Time, unknown map[string][]string) int {
	removed := 0
	for _, id := range ids {
		s, ok := b.Shard(id)
		if !ok || !ShardSettled(s) || ShardEnded(b, s).After(before) && !mutantOn("shard_removed_early") || legacyWholeBlock(s, s.Spent, s.Unknown) {
			continue
		}
		sound := true
		for d := range s.Allocated {
			if s.Spent[d] < 0 || s.Reminted[d] < 0 || s.Spent[d]+s.Reminted[d] != s.Allocated[d] {
				sound = false
			}
		}
		if !sound {
			continue
		}
		var names []string
		pending := false
		for _, name := range unknown[id] {
			units, own := ownUnknownName(id, name)
			if !own {
				continue
			}
			if !units && b.Meta(name) == pendingUnknown {
				pending = true
			}
			names = append(names, name)
		}
		if pending {
			continue
		}
		moves := b.Meta(metaShardMoves(id))
		addRetainedShard(b, s, moves)
		for _, name := range names {
			b.MetaRemove(name)
		}
		b.MetaRemove(metaShardMoves(id))
		b.MetaRemove(MetaShardRefusedFor(id))
		b.ShardRemove(id)
		removed++
	}
	return removed
}

// addRetainedShard adds s (with its moves remint moves) to its account's
// retained shard totals.
func addRetainedShard(b MetaRemover, s *Shard, moves int64) {
	k := s.Account
	add := func(term string, d int, v int64) {
		if v != 0 {
			name := metaShardRetained(k, term, d)
			b.MetaPut(name, b.Meta(name)+v)
		}
	}
	add(retainedShardsCount, -1, 1)
	add(retainedShardsRemints, -1, moves)
	for d := range s.Allocated {
		add(retainedShardsAllocated, d, s.Allocated[d])
		if !mutantOn("shard_retained_drops_spent") {
			add(retainedShardsSpent, d, s.Spent[d])
		}
		add(retainedShardsReminted, d, s.Reminted[d])
	}
}
