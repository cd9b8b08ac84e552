package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
)

// TestTwoGatewaysReserveAtOnceThroughLostAnswers: two gateways, each
// through its own fault proxy that loses and tears answers and requests,
// reserve 600 tokens each for 40 requests at the same instant against a
// burst of 6,000 (a real server over a socket, on SQLite). Lost answers
// are retried with the same ids and resolved by lookup. Once the network
// heals and every id is looked up: exactly ten reservations hold 600 each
// (nothing oversold, no id debited twice), every reservation a gateway saw
// admitted is among them and every one it saw refused holds nothing,
// available is 0, never negative, the account conserves, and the audit is
// clean.
func TestTwoGatewaysReserveAtOnceThroughLostAnswers(t *testing.T) {
	const (
		requests = 40
		size     = 600
		burst    = 6000
	)
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: burst, holdTTL: time.Hour})
	faults := faultproxy.Faults{DropResponse: 0.2, TruncateResponse: 0.05, DropRequest: 0.05}
	second, err := faultproxy.Start(l.addr, faultSeed(t)+1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	proxies := []*faultproxy.Proxy{l.proxy, second}
	retries := WithRetryPolicy(RetryPolicy{MaxAttempts: 4, BaseDelay: 2 * time.Millisecond, MaxDelay: 20 * time.Millisecond})
	gateways := []*Client{l.viaProxy(t, retries)}
	other, err := New(second.Addr(), noBreakerWatchdog, retries)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	gateways = append(gateways, other)
	for _, p := range proxies {
		p.SetFaults(faults)
	}

	// seen[i]: what gateway i%2 was told about reservation i.
	type outcome int
	const (
		unresolved outcome = iota
		admitted
		refused
	)
	seen := make([]outcome, requests)
	id := func(i int) string { return fmt.Sprintf("gw%d-req-%02d", i%2, i) }
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := gateways[i%2].Reserve(ctx, ReserveRequest{ReservationID: id(i), Subject: "tenant-7", Route: "chat.generate",
				Units: Units{"tokens": size}, BodyHash: id(i)})
			var rejected *RejectedError
			var unknown *ReservationUnknownError
			switch {
			case err == nil:
				seen[i] = admitted
			case errors.As(err, &rejected):
				seen[i] = refused
			case errors.As(err, &unknown), connect.CodeOf(err) == connect.CodeUnavailable:
				// Lost for now: looked up below.
			default:
				t.Errorf("reserve %s: %v", id(i), err)
			}
		}()
	}
	close(ready)
	wg.Wait()
	var faulted int64
	for _, p := range proxies {
		faulted += p.Stats().Faulted()
		p.SetFaults(faultproxy.Faults{})
	}
	if faulted == 0 {
		t.Fatal("the proxies injected no fault: the test tested nothing")
	}

	ctx := context.Background()
	holding, unresolvedCount := 0, 0
	for i := range requests {
		r, err := l.direct.GetReservation(ctx, id(i))
		found := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatalf("look up %s: %v", id(i), err)
		}
		switch {
		case seen[i] == admitted && !found:
			t.Errorf("%s: admitted to its gateway, unknown to the ledger", id(i))
		case seen[i] == refused && found:
			t.Errorf("%s: refused to its gateway, yet the ledger holds %v", id(i), r)
		case found && (r.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_RESERVED || r.GetReservedUnits()["tokens"] != size):
			t.Errorf("%s: %v, want RESERVED with %d tokens", id(i), r, size)
		}
		if found {
			holding++
		}
		if seen[i] == unresolved {
			unresolvedCount++
		}
	}
	t.Logf("%d faults injected; %d ids unresolved until looked up", faulted, unresolvedCount)
	b := l.balance(t, "tenant-7", "chat.generate")
	in := b.GetOpening() + b.GetMinted() + b.GetOverdraftIssued()
	out := b.GetAvailable() + b.GetReserved() + b.GetSpent() + b.GetRetiredForEmergency() + b.GetRetiredForMove() + b.GetOverdraftRepaid()
	if holding != burst/size || b.GetReserved() != burst || b.GetAvailable() != 0 || in != out {
		t.Errorf("%d reservations hold capacity, balance %v; want %d holding %d tokens, 0 available, conserving", holding, b, burst/size, burst)
	}
	l.audit(t)
}
