package client

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// Past its limit PendingUnknown drops the oldest receipt from memory,
// counts it and hands it to the drop handler; the ledger still lists the
// reservation USAGE_UNKNOWN, and the dropped receipt still resolves it.
func TestPendingUnknownDropsTheOldestPastItsLimit(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	var mu sync.Mutex
	var dropped []OperationReceipt
	c, err := New(l.addr, noBreakerWatchdog, WithPendingLimit(2, func(r OperationReceipt) {
		mu.Lock()
		dropped = append(dropped, r)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var receipts []OperationReceipt
	for i := range 3 {
		_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
			func(context.Context) (Units, error) {
				return nil, fmt.Errorf("backend %d lost the count: %w", i, ErrUsageUnknown)
			})
		receipts = append(receipts, mustErrAs[*UsageUnknownError](t, err).Receipt)
	}
	pending := c.PendingUnknown()
	kept := map[string]bool{}
	for _, r := range pending {
		kept[r.ReservationID] = true
	}
	if len(pending) != 2 || !kept[receipts[1].ReservationID] || !kept[receipts[2].ReservationID] {
		t.Fatalf("pending %+v: want the two newest of %+v", pending, receipts)
	}
	mu.Lock()
	gotDropped := dropped
	mu.Unlock()
	if c.PendingDropped() != 1 || len(gotDropped) != 1 || gotDropped[0].ReservationID != receipts[0].ReservationID || gotDropped[0].OperationID != receipts[0].OperationID {
		t.Fatalf("dropped %d %+v: want the oldest, %s", c.PendingDropped(), gotDropped, receipts[0].ReservationID)
	}

	list, err := c.rpc.ListUsageUnknown(context.Background(), connect.NewRequest(&ledgerv1.ListUsageUnknownRequest{Subject: "tenant-7"}))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, r := range list.Msg.GetReservations() {
		listed[r.GetReservationId()] = true
	}
	for _, r := range receipts {
		if !listed[r.ReservationID] {
			t.Fatalf("%s is not USAGE_UNKNOWN at the ledger: %v", r.ReservationID, listed)
		}
	}
	for i, r := range append(gotDropped, pending...) {
		if _, err := c.ResolveUnknown(context.Background(), r, Units{"tokens": int64(10 + i)}); err != nil {
			t.Fatalf("resolve %s: %v", r.ReservationID, err)
		}
	}
	if left := c.PendingUnknown(); len(left) != 0 {
		t.Fatalf("left pending: %+v", left)
	}
	l.audit(t)
}

// A dropped receipt whose usage was known leaves the background resends
// too: they stay within the limit however long the ledger is away.
func TestPendingUnknownLimitBoundsTheResends(t *testing.T) {
	c, err := New("127.0.0.1:1", noBreakerWatchdog, WithPendingLimit(3, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 50 {
		c.keepPending(OperationReceipt{ReservationID: fmt.Sprintf("r%d", i), OperationID: fmt.Sprintf("op%d", i), Actual: Units{"tokens": 1}})
	}
	c.lookups.mu.Lock()
	due := len(c.resends.due)
	c.lookups.mu.Unlock()
	if due > 3 || len(c.PendingUnknown()) != 3 || c.PendingDropped() != 47 {
		t.Fatalf("%d resends, %d pending, %d dropped: want at most 3, 3, 47", due, len(c.PendingUnknown()), c.PendingDropped())
	}
}

// The oldest goes first (a receipt kept again keeps its age), and the
// bookkeeping of the order stays within about twice the receipts kept
// however many are kept and resolved.
func TestPendingReceiptsOrderAndBound(t *testing.T) {
	p := newPendingReceipts(3, nil, nil)
	for _, id := range []string{"a", "b", "c"} {
		p.keep(OperationReceipt{ReservationID: id})
	}
	p.keep(OperationReceipt{ReservationID: "a", OperationID: "again"})
	if d := p.keep(OperationReceipt{ReservationID: "d"}); len(d) != 1 || d[0].ReservationID != "a" || d[0].OperationID != "again" {
		t.Fatalf("dropped %+v, want a (kept again, not younger)", d)
	}
	p.remove("b")
	if d := p.keep(OperationReceipt{ReservationID: "e"}); len(d) != 0 {
		t.Fatalf("dropped %+v with room left", d)
	}
	if d := p.keep(OperationReceipt{ReservationID: "f"}); len(d) != 1 || d[0].ReservationID != "c" {
		t.Fatalf("dropped %+v, want c", d)
	}
	p.remove("d")
	for i := range 10_000 {
		id := fmt.Sprintf("x%d", i)
		p.keep(OperationReceipt{ReservationID: id})
		p.remove(id)
		if n := len(p.order) - p.head; n > 2*len(p.byID)+65 {
			t.Fatalf("after %d: %d refs for %d receipts", i, n, len(p.byID))
		}
	}
	if got := p.list(); len(got) != 2 || got[0].ReservationID != "e" || got[1].ReservationID != "f" {
		t.Fatalf("kept %+v", got)
	}
}
