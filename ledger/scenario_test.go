package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

var t0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func tokensPolicy(burst int64) *ledger.Policy {
	p := ledger.Policy{
		Key:        ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500}},
		HoldTTL:    30 * time.Second,
	}.WithDefaults()
	return &p
}

func mustAudit(t *testing.T, m *ledger.Memory) {
	t.Helper()
	for _, d := range ledger.Audit(m.Snapshot()) {
		t.Errorf("audit: %s", d)
	}
}

// The seed's opening scenario: three gateways each see 1,000 remaining and
// reserve 600 at once; exactly one is admitted. The executor uses 200, so 400
// are refunded, once. The client retries after a timeout with the same id and
// gets the same receipt, with no second debit.
func TestSeedScenarioThreeGateways(t *testing.T) {
	m := ledger.NewMemory()
	if res := ledger.PublishPolicy(m, tokensPolicy(1000), t0); res.Err != nil {
		t.Fatal(res.Err)
	}
	admitted := 0
	for i, id := range []string{"rl-gw1", "rl-gw2", "rl-gw3"} {
		res := ledger.Reserve(m, &ledger.Command{ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{600}}, t0)
		switch {
		case res.Err == nil:
			admitted++
		case errors.Is(res.Err, ledger.ErrInsufficientCapacity):
			if res.Dimension != "tokens" || res.Generation != 1 || res.RetryAfter <= 0 {
				t.Errorf("gateway %d: rejection lacks details: %+v", i, res)
			}
		default:
			t.Fatalf("gateway %d: %v", i, res.Err)
		}
	}
	if admitted != 1 {
		t.Fatalf("admitted %d of three 600-unit reservations against 1000", admitted)
	}
	if res := ledger.Start(m, "rl-gw1", "op-1", t0); res.Err != nil {
		t.Fatal(res.Err)
	}
	res := ledger.Settle(m, "rl-gw1", "op-1", ledger.Amounts{200}, t0)
	if res.Err != nil || res.Refunded[0] != 400 || res.Reservation.State != ledger.StateSettled {
		t.Fatalf("settle: %+v", res)
	}
	again := ledger.Settle(m, "rl-gw1", "op-1", ledger.Amounts{200}, t0)
	if again.Err != nil || !again.Replayed || again.Refunded[0] != 0 {
		t.Fatalf("second settle refunded again: %+v", again)
	}
	retry := ledger.Reserve(m, &ledger.Command{ReservationID: "rl-gw1", RequestDigest: "sha256:rl-gw1",
		Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{600}}, t0)
	if retry.Err != nil || !retry.Replayed || retry.Reservation.State != ledger.StateSettled {
		t.Fatalf("retry: %+v", retry)
	}
	a, _ := m.Account(ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: 1})
	if a.Balances[0].Available != 800 || a.Balances[0].Spent != 200 {
		t.Fatalf("balances after the scenario: %+v", a.Balances[0])
	}
	mustAudit(t, m)
}
