package client

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/client/internal/faultproxy"
)

// In a partition the fair queue does not make a request wait for its
// policy read (GetPolicy with the caller's context and its retries, up to
// six attempts of the call timeout while the breaker stays closed): it
// waits at most PolicyWait, takes the weight last read for the subject,
// route and region, and the read goes on in the background and is cached
// once the ledger answers. Here the breaker never opens (no watchdog, a
// call timeout of a minute): only the bound ends the wait.
func TestFairQueueWeightDoesNotWaitThroughAPartition(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000, weight: 4})
	gw := l.viaProxy(t, WithTimeout(time.Minute), WithBreaker(BreakerPolicy{DetectTimeout: time.Minute}))
	q, err := gw.NewFairQueue(FairQueueConfig{Concurrency: 1, CostUnit: "tokens", PolicyWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}}
	first, err := l.direct.Reserve(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := q.weight(ctx, "tenant-7", first.Reservation); w != 4 {
		t.Fatalf("weight %d, want the policy's 4", w)
	}
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000, weight: 6})
	second, err := l.direct.Reserve(ctx, req) // under the new generation, not read yet
	if err != nil {
		t.Fatal(err)
	}
	if second.Reservation.GetPolicyGeneration() == first.Reservation.GetPolicyGeneration() {
		t.Fatal("the second policy did not make a new generation")
	}

	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	type answer struct {
		weight int64
		done   func(Units)
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		w, _ := q.weight(ctx, "tenant-7", second.Reservation)
		done, err := q.acquire(ctx, second)
		got <- answer{w, done, err}
	}()
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatalf("acquire in the partition: %v", a.err)
		}
		a.done(nil)
		if a.weight != 4 {
			t.Fatalf("weight %d in the partition, want 4, the last read for tenant-7", a.weight)
		}
	case <-time.After(30 * time.Second): // a hang guard: the read alone may take minutes
		t.Fatal("the fair queue waits for the policy read while the ledger is partitioned")
	}

	l.proxy.SetFaults(faultproxy.Faults{}) // healed: the read in the background lands
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if w, _ := q.weight(ctx, "tenant-7", second.Reservation); w == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new generation's weight was never read after the partition healed")
		}
	}
}
