package sim

import (
	"fmt"

	"github.com/capledger/capledger/ledger"
)

// The central shard row checked against the gateway's side. The gateway
// knows its shard's allocation, its local shard ledger and every
// submission of receipts it sent; from those alone (not from the ledger's
// code) follows what the central row must say after each accepted
// submission:
//
//   - the first: unknown = the holds of the STARTED / USAGE_UNKNOWN
//     receipts, spent = the settled usage up to what the rest of the
//     allocation covers, the excess charged as debt, reminted = the rest;
//   - each later one: every receipt resolves the hold the first left
//     unknown, into spent (up to the hold), reminted (the rest of the
//     hold) and charged (usage beyond the hold).
//
// Every fresh submission must be applied exactly once, in order, so the
// k-th change of a reconciled row must equal the model after the first k
// submissions, and a refusal as "already reconciled" is correct only for
// a copy of a submission that an earlier copy already applied.

// shardModel is the expected central reconciliation record.
type shardModel struct {
	spent, unknown, reminted, charged ledger.Amounts
	holds                             map[string]ledger.Amounts
}

func unknownReceipt(r *ledger.ShardReceipt) bool {
	return r.State == ledger.StateStarted || r.State == ledger.StateUsageUnknown
}

func settledReceipt(r *ledger.ShardReceipt) bool {
	return r.State == ledger.StateSettled || r.State == ledger.StateSettledWithDebt
}

// modelShard returns the expected record after the first k submissions.
func modelShard(allocated ledger.Amounts, subs [][]ledger.ShardReceipt, k int) shardModel {
	m := shardModel{holds: map[string]ledger.Amounts{}}
	for i := 0; i < k && i < len(subs); i++ {
		sub := subs[i]
		if i == 0 {
			var used ledger.Amounts
			for j := range sub {
				r := &sub[j]
				switch {
				case unknownReceipt(r):
					m.holds[r.ReservationID] = r.Reserved
					for d := range used {
						m.unknown[d] += r.Reserved[d]
					}
				case settledReceipt(r):
					for d := range used {
						used[d] += r.Actual[d]
					}
				}
			}
			for d := range used {
				m.spent[d] = min(used[d], allocated[d]-m.unknown[d])
				m.charged[d] = used[d] - m.spent[d]
				m.reminted[d] = allocated[d] - m.spent[d] - m.unknown[d]
			}
			continue
		}
		for j := range sub {
			r := &sub[j]
			hold := m.holds[r.ReservationID]
			delete(m.holds, r.ReservationID)
			for d := range hold {
				var used ledger.Units
				if settledReceipt(r) {
					used = r.Actual[d]
				}
				covered := min(used, hold[d])
				m.unknown[d] -= hold[d]
				m.spent[d] += covered
				m.reminted[d] += hold[d] - covered
				m.charged[d] += used - covered
			}
		}
	}
	return m
}

// shardRowApplied checks the central row of a shard after a commit applied
// a reconciliation to it: it must be the model after one more of the
// gateway's submissions, and that submission must have been sent.
func (w *world) shardRowApplied(row *ledger.Shard) {
	s := &w.shards
	key := s.key(row.ID)
	sh := s.byLife[key]
	if sh == nil {
		w.violate(GateShardConservation, fmt.Sprintf("shard %s was reconciled, but no gateway ever took it", key))
		return
	}
	s.applied[key]++
	k := s.applied[key]
	if k > len(sh.subs) {
		w.violate(GateDuplicateRecovery, fmt.Sprintf("shard %s shows %d reconciliations applied, its gateway sent %d submissions", row.ID, k, len(sh.subs)))
		return
	}
	want := modelShard(row.Allocated, sh.subs, k)
	if row.Spent == want.spent && row.Unknown == want.unknown && row.Reminted == want.reminted && s.charged[key] == want.charged {
		return
	}
	gate := GateShardConservation
	for d := range row.Unknown {
		if row.Unknown[d] < want.unknown[d] || row.Reminted[d] > want.reminted[d] {
			// Capacity the receipts show in use (or still unknown) came
			// back as unused.
			gate = GateUnknownAsUnconsumed
		}
	}
	w.violate(gate, fmt.Sprintf("shard %s after submission %d of %d receipts: central spent %v unknown %v reminted %v charged %v; "+
		"the gateway's receipts give spent %v unknown %v reminted %v charged %v",
		key, k, len(sh.subs[k-1]), row.Spent, row.Unknown, row.Reminted, s.charged[key],
		want.spent, want.unknown, want.reminted, want.charged))
}

// shardCopyApplied reports whether submission sub (1 the first) of sh was
// really in flight before a refusal of it as already reconciled: another
// copy of it reached the ledger, and the central row shows it applied. It
// records a protocol violation (returning false) otherwise.
func (w *world) shardCopyApplied(sh *simShard, sub int) bool {
	if sub < 1 || sub > len(sh.subs) {
		w.violate(GateProtocol, fmt.Sprintf("shard reconcile %s answered for submission %d of %d", sh.id, sub, len(sh.subs)))
		return false
	}
	copies, applied := sh.delivered[sub-1], w.shards.applied[sh.key]
	if copies >= 2 && applied >= sub {
		return true
	}
	w.violate(GateProtocol, fmt.Sprintf("shard reconcile %s refused submission %d (%d receipts) as already reconciled, "+
		"but %d copies of it reached the ledger and the central row shows %d submissions applied",
		sh.id, sub, len(sh.subs[sub-1]), copies, applied))
	return false
}

// shardDelivered counts a copy of a shard submission reaching the ledger.
func (w *world) shardDelivered(m *message) {
	if m.probe || m.cmd.Kind != ledger.KindShardReconcile || m.sub < 1 {
		return
	}
	sh := w.shards.list[m.owner]
	if int(m.sub) <= len(sh.delivered) {
		sh.delivered[m.sub-1]++
	}
}

// shardFinal checks, at the end, every shard the ledger issued against its
// gateway's local shard ledger: reconciled, nothing left unknown, every
// submission applied, and the central usage (spent plus what was charged
// as debt beyond the shard) equal to the usage settled locally.
func (w *world) shardFinal() {
	s := &w.shards
	for _, sh := range s.list {
		row, ok := s.rows[sh.key]
		if !ok {
			continue // never issued
		}
		if sh.local == nil {
			// The one issued shard its gateway may never hold: issued by a
			// late copy, reconciled whole by a closing submission whose
			// answer was lost (shardRowApplied checked the row against it:
			// nothing spent), then removed before the resend arrived.
			if s.removed[sh.key] && sh.phase == shDone && s.applied[sh.key] == len(sh.subs) {
				continue
			}
			w.violate(GateShardConservation, fmt.Sprintf("shard %s was issued, but its gateway never learnt of it", sh.id))
			return
		}
		var local ledger.Amounts
		for _, r := range sh.local.Reservations() {
			if r.State == ledger.StateSettled || r.State == ledger.StateSettledWithDebt {
				for d := range local {
					local[d] += r.Actual[d]
				}
			}
		}
		var central ledger.Amounts
		charged := s.charged[sh.key]
		for d := range central {
			central[d] = row.Spent[d] + charged[d]
		}
		switch {
		case !row.Reconciled || row.Unknown != (ledger.Amounts{}):
			w.violate(GateShardConservation, fmt.Sprintf("shard %s ends with reconciled=%v unknown %v", sh.id, row.Reconciled, row.Unknown))
		case s.applied[sh.key] != len(sh.subs):
			w.violate(GateShardConservation, fmt.Sprintf("shard %s: the gateway sent %d submissions, the central row shows %d applied", sh.id, len(sh.subs), s.applied[sh.key]))
		case central != local:
			w.violate(GateUnknownAsUnconsumed, fmt.Sprintf("shard %s: central spent %v + charged %v, but the gateway settled %v locally", sh.id, row.Spent, charged, local))
		}
		if w.fail != nil {
			return
		}
	}
}
