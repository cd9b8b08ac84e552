package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Reserve whose answers are all lost, under an id already admitted for
// another request, resolves by lookup to ErrDigestMismatch: a definite
// refusal, not RESERVATION_UNKNOWN (which would have the gateway repeat
// the id forever) and no background lookup. (A planted break, the lookup's
// mismatch answered as unknown, passed every other test.)
func TestLostReserveUnderAnotherRequestsIDIsADigestMismatch(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	first, err := l.direct.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	if err != nil {
		t.Fatal(err)
	}
	c := l.viaProxy(t, WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
	l.proxy.DropNextResponses(3) // every Reserve answer is lost; the lookup gets through
	_, err = c.Reserve(context.Background(), ReserveRequest{ReservationID: first.ReservationID,
		Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 101}})
	var unknown *ReservationUnknownError
	if !errors.Is(err, ErrDigestMismatch) || errors.As(err, &unknown) {
		t.Fatalf("lost reserve under an id admitted for another request: %v, want ErrDigestMismatch", err)
	}
	if st := l.proxy.Stats(); st.DroppedResponses != 3 {
		t.Fatalf("proxy stats %+v: the faults did not happen", st)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 100 {
		t.Fatalf("reserved %d, want the first request's 100 alone", b.GetReserved())
	}
}
