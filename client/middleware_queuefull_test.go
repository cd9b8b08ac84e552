package client

import (
	"context"
	"net/http"
	"strings"
	"testing"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// CLIENTS.md, section 8: a request refused after its reservation was made
// (here 429 QUEUE_FULL, against a `capledger serve` process) carries the
// reservation's id in X-Capledger-Reservation, as a request that ran
// does, and the ledger shows that reservation released.
func TestMiddlewareQueueFullNamesTheReleasedReservation(t *testing.T) {
	addr := startLedgerProcess(t, t.TempDir())
	c, err := New(addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	publishTenantPolicy(t, c, false)
	if _, _, err := c.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "blocker", Route: "chat.generate", Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 10_000}},
	}); err != nil {
		t.Fatal(err)
	}
	q, err := c.NewFairQueue(FairQueueConfig{Concurrency: 1, CostUnit: "tokens", MaxQueuePerTenant: 1})
	if err != nil {
		t.Fatal(err)
	}
	release, blockerRunning := make(chan struct{}), make(chan struct{})
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenant") == "blocker" {
			close(blockerRunning)
			<-release
		}
		ReportUsage(r.Context(), Units{"tokens": 10})
	})
	tokens := NewEstimator("sha256:tokens-100", func(*http.Request, []byte) (Units, error) { return Units{"tokens": 100}, nil })
	gw := gateway(t, c, MiddlewareConfig{Queue: q, Estimator: tokens}, backend)
	defer close(release) // before the gateway's Close, which a blocked handler would hang
	answered := make(chan error, 2)
	go func() { _, _, err := trySend(gw.Client(), gw.URL, "blocker", "x"); answered <- err }()
	<-blockerRunning
	go func() { _, _, err := trySend(gw.Client(), gw.URL, "tenant-7", "queued"); answered <- err }()
	waitQueued(t, q, 1)

	resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "refused")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "QUEUE_FULL") {
		t.Fatalf("%d %s, want 429 QUEUE_FULL", resp.StatusCode, body)
	}
	id := resp.Header.Get(ReservationHeader)
	if id == "" {
		t.Fatalf("429 QUEUE_FULL without %s", ReservationHeader)
	}
	res, err := c.GetReservation(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if res.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_RELEASED || res.GetSubject() != "tenant-7" {
		t.Fatalf("reservation %s: %s of %s, want RELEASED of tenant-7", id, res.GetState(), res.GetSubject())
	}
}
