package client

import (
	"context"
	"net/http"
	"testing"
)

// A Start whose request was lost never landed, and another operation
// started the reservation before Run undid it: the release answers
// "already started", the zero settle OPERATION_MISMATCH. Nothing of this
// operation is held, so Run keeps nothing and reports nothing
// (docs/CLIENTS.md, rule 5: only RESERVATION_NOT_FOUND is reported).
func TestAbandonedStartTakenByAnotherOperationIsNotReported(t *testing.T) {
	const id = "abandon-mismatch"
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	h := &heldAfterReturn{hold: make(chan struct{})}
	f := faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{startCall: requestLost, getCall: requestLost},
		before: map[string]func(){
			releaseCall: func() {
				if h.returned.Load() {
					h.wait()
					return
				}
				if _, err := l.direct.Start(context.Background(), id, "another-operation"); err != nil {
					t.Errorf("the other operation's start: %v", err)
				}
			},
			settleCall: h.wait,
		}}
	c := runAbandonedStart(t, l, h, f, id)
	if pending := c.PendingUnknown(); len(pending) != 0 {
		t.Fatalf("pending %+v: another operation holds the reservation, nothing of this one", pending)
	}
	if n := c.PendingRefused(); n != 0 {
		t.Fatalf("%d receipts reported refused, want none: OPERATION_MISMATCH lets the abandoned Start go silently", n)
	}
}
