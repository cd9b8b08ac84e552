package server

import (
	"context"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// heldReload is policyRows whose read of every policy (a reload) stops,
// once it read its rows, until released.
type heldReload struct {
	*policyRows
	read, release chan struct{}
}

func (l *heldReload) Policies(ctx context.Context) ([]ledger.Policy, error) {
	rows, err := l.policyRows.Policies(ctx)
	l.read <- struct{}{}
	<-l.release
	return rows, err
}

// A reload of every policy that read its rows before a publish on this
// replica was taken in (published), and takes them in after, keeps the
// published generation: the replica that published admits under it at
// once (API.md), without a miss. It was forgotten until a miss read it
// again, and a reserve within 100 ms of the reload answered NO_POLICY.
// (ListPolicies reloaded the cache, and this was tested through it; it
// reads a page of the store now, and the reloads left are the cache's
// own, after a miss or a stale refusal that the heads did not settle.)
func TestAReloadThatReadBeforeAPublishKeepsThePublishedGeneration(t *testing.T) {
	ctx := context.Background()
	l := &heldReload{policyRows: &policyRows{}, read: make(chan struct{}), release: make(chan struct{})}
	a := ledger.PolicyKey{Subject: "tenant-a", Route: "chat.generate", Region: "global"}
	b := ledger.PolicyKey{Subject: "tenant-b", Route: "chat.generate", Region: "global"}
	l.publish(a)
	cache := newPolicyCache(l)
	reloaded := make(chan error, 1)
	go func() {
		_, err := cache.refresh(ctx)
		reloaded <- err
	}()
	<-l.read // the reload read its rows: only tenant-a's
	g := l.publish(b)
	cache.published(l.rows[g-1])
	close(l.release)
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	if p, ok := cache.active(b); !ok || p.Generation != g {
		t.Fatalf("after the reload the cache decides %+v (%v) for the key published during it, want generation %d", p, ok, g)
	}
	if p, ok := cache.active(a); !ok || p.Generation != 1 {
		t.Fatalf("after the reload the cache decides %+v (%v) for tenant-a, want generation 1", p, ok)
	}
}
