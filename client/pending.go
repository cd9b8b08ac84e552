package client

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultPendingLimit is how many receipts PendingUnknown keeps unless
// WithPendingLimit says otherwise: some hundreds of bytes each, so tens of
// MB at most.
const DefaultPendingLimit = 100_000

// WithPendingLimit bounds the receipts the Client keeps in memory for
// PendingUnknown (default DefaultPendingLimit; limit <= 0 keeps the
// default). When a new receipt would pass the limit the oldest kept one is
// dropped from memory: it leaves PendingUnknown and is no longer resent,
// Client.PendingDropped counts it, and dropped (if not nil) receives it,
// e.g. to write it somewhere durable. Nothing is lost at the ledger: no
// answer this Client got for the receipt was final (such a receipt leaves
// PendingUnknown at once, see ErrReceiptRefused), so the reservation is
// held there, USAGE_UNKNOWN (the ledger's execution limit marks started
// work whose mark did not land; a hold whose start never landed expires),
// listed by ListUsageUnknown and resolved with its operation receipt
// (ResolveUnknown or Settle with its ids) or by the USAGE_UNKNOWN
// resolver, unless the resolver or an operator already settled it since
// the Client last asked (GetReservation tells). dropped is called without
// locks held, from the goroutine that kept the newer receipt.
func WithPendingLimit(limit int, dropped func(OperationReceipt)) Option {
	return func(c *config) { c.pendingLimit, c.pendingDropped = limit, dropped }
}

// WithRefusedReceipts sets refused, called with each receipt the Client
// dropped, without a caller to tell, because the ledger's answer to it
// was final (the error matches ErrReceiptRefused and the answer), e.g. to
// log it or to reconcile the usage it carried with the settle the ledger
// recorded:
//   - the background resend of a known usage (see PendingUnknown):
//     ErrAlreadySettled, ErrOperationMismatch or ErrNotFound;
//   - the background check of a receipt of unknown usage, which read its
//     reservation ended: a *LedgerError of Op "get reservation" with the
//     reservation as read, matching ErrAlreadySettled, ErrReleased,
//     ErrExpired or ErrOperationMismatch; or ErrNotFound;
//   - Run undoing a Start whose answer was lost, answered ErrNotFound
//     (never kept: a Start that landed may hold capacity, see
//     ErrReceiptRefused).
//
// Client.PendingRefused counts them, with or without refused. A receipt
// ResolveUnknown dropped so is not passed: its caller got the error.
// refused is called without locks held, from a goroutine of the resend
// loop or of Run.
func WithRefusedReceipts(refused func(OperationReceipt, error)) Option {
	return func(c *config) { c.pendingRefused = refused }
}

// pendingReceipts are the receipts of PendingUnknown, by reservation id,
// at most limit of them, the oldest dropped first.
type pendingReceipts struct {
	mu    sync.Mutex
	byID  map[string]pendingEntry
	order []pendingRef // oldest first from head; refs whose entry went or was replaced are skipped
	head  int
	seq   uint64
	limit int
	// dropped counts the receipts dropped for the limit; onDrop gets them.
	dropped atomic.Uint64
	onDrop  func(OperationReceipt)
	// refused counts the receipts the resend dropped on a final answer;
	// onRefuse gets them.
	refused  atomic.Uint64
	onRefuse func(OperationReceipt, error)
	// resolving counts the resolveUnknown calls in flight, by reservation
	// id: a check (removeChecked) does not drop their receipts.
	resolving map[string]int
}

type pendingEntry struct {
	receipt OperationReceipt
	seq     uint64
}

type pendingRef struct {
	id  string
	seq uint64
}

func newPendingReceipts(limit int, onDrop func(OperationReceipt), onRefuse func(OperationReceipt, error)) *pendingReceipts {
	if limit <= 0 {
		limit = DefaultPendingLimit
	}
	return &pendingReceipts{byID: map[string]pendingEntry{}, limit: limit, onDrop: onDrop, onRefuse: onRefuse, resolving: map[string]int{}}
}

// keep keeps r (replacing a receipt of the same reservation, which keeps
// its age) and returns the receipts it dropped to stay within the limit.
func (p *pendingReceipts) keep(r OperationReceipt) (dropped []OperationReceipt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.byID[r.ReservationID]; ok {
		p.byID[r.ReservationID] = pendingEntry{receipt: r, seq: old.seq}
		return nil
	}
	for len(p.byID) >= p.limit {
		ref := p.order[p.head]
		p.order[p.head] = pendingRef{}
		p.head++
		if e, ok := p.byID[ref.id]; ok && e.seq == ref.seq {
			delete(p.byID, ref.id)
			dropped = append(dropped, e.receipt)
		}
	}
	p.seq++
	p.byID[r.ReservationID] = pendingEntry{receipt: r, seq: p.seq}
	p.order = append(p.order, pendingRef{id: r.ReservationID, seq: p.seq})
	p.tidy()
	return dropped
}

// tidy drops the refs of resolved receipts from order once they are most
// of it, so order stays within about twice the receipts kept however many
// come and go.
func (p *pendingReceipts) tidy() {
	if live := len(p.order) - p.head; live <= 2*len(p.byID)+64 {
		return
	}
	order := make([]pendingRef, 0, 2*len(p.byID)+1)
	for _, ref := range p.order[p.head:] {
		if e, ok := p.byID[ref.id]; ok && e.seq == ref.seq {
			order = append(order, ref)
		}
	}
	p.order, p.head = order, 0
}

func (p *pendingReceipts) has(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.byID[id]
	return ok
}

func (p *pendingReceipts) remove(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byID, id)
	p.tidy()
}

// hasOperation reports whether the receipt kept for reservation id is
// the one of operation op.
func (p *pendingReceipts) hasOperation(id, op string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byID[id]
	return ok && e.receipt.OperationID == op
}

// resolveBegins and resolveEnds bracket a resolveUnknown of reservation
// id (see removeChecked).
func (p *pendingReceipts) resolveBegins(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resolving[id]++
}

func (p *pendingReceipts) resolveEnds(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resolving[id]--; p.resolving[id] <= 0 {
		delete(p.resolving, id)
	}
}

// removeChecked is removeOperation for a check that read the reservation
// ended, except while a resolveUnknown of it is in flight: the end the
// check read may be that call's own settle, which that call answers.
func (p *pendingReceipts) removeChecked(id, op string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resolving[id] == 0 && p.removeOperationLocked(id, op)
}

// removeOperation removes the receipt kept for reservation id if it is
// the one of operation op, and reports whether it did.
func (p *pendingReceipts) removeOperation(id, op string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.removeOperationLocked(id, op)
}

func (p *pendingReceipts) removeOperationLocked(id, op string) bool {
	e, ok := p.byID[id]
	if !ok || e.receipt.OperationID != op {
		return false
	}
	delete(p.byID, id)
	p.tidy()
	return true
}

// list returns copies of the receipts kept, by reservation id.
func (p *pendingReceipts) list() []OperationReceipt {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := slices.Sorted(maps.Keys(p.byID))
	out := make([]OperationReceipt, len(ids))
	for i, id := range ids {
		out[i] = p.byID[id].receipt.clone()
	}
	return out
}
