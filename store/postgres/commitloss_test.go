package postgres_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/internal/replicatest"
)

// TestLostCommitAnswersOfRefundsAndRepayments: two `capledger serve`
// replicas on one schema, the first reaching PostgreSQL through a proxy
// that loses the answer to one COMMIT after the server committed it. The
// transactions whose COMMIT answers are lost are a settle's (refunding
// the unused rest), a release's, and a reserve's whose batch repays a debt
// from refill (the seed's lost refund and debt-repayment ACKs, at the
// database). The replica answers without claiming success, and the
// gateway's retries with the same ids, first on the same replica (whose
// memory of the batch must not be trusted) and then on the other, replay
// the stored outcome: each refund and each repayment is made once, the
// account's terms are exact, and the audit is clean.
func TestLostCommitAnswersOfRefundsAndRepayments(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	dsn := schemaDSN(t)
	cutter := newCommitCutter(t, targetOf(t, dsn))
	bin := replicatest.BuildCapledger(t)
	lossy := replicatest.StartReplica(t, bin, cutter.dsnVia(t, dsn))
	other := replicatest.StartReplica(t, bin, dsn)
	ledgerOf := func(r *replicatest.Replica) capledgerv1connect.LedgerServiceClient {
		return capledgerv1connect.NewLedgerServiceClient(&http.Client{Timeout: 30 * time.Second}, "http://"+r.Addr)
	}
	viaLossy, viaOther := ledgerOf(lossy), ledgerOf(other)
	ctx := context.Background()

	if _, err := viaOther.PublishPolicy(ctx, connect.NewRequest(&ledgerv1.PublishPolicyRequest{Policy: &ledgerv1.Policy{
		Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region,
		HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(10 * 365 * 24 * time.Hour),
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1000, MaxOverdraft: 1000,
			RefillUnits: 500, RefillInterval: durationpb.New(3 * time.Second)}},
	}})); err != nil {
		t.Fatal(err)
	}
	tokens := func(n int64) map[string]int64 { return map[string]int64{"tokens": n} }
	reserve := func(c capledgerv1connect.LedgerServiceClient, id string, n int64) (*ledgerv1.ReserveResponse, error) {
		res, err := c.Reserve(ctx, connect.NewRequest(&ledgerv1.ReserveRequest{ReservationId: id,
			Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: tokens(n)}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	mustReserve := func(id string, n int64) {
		t.Helper()
		if _, err := reserve(viaOther, id, n); err != nil {
			t.Fatalf("reserve %s: %v", id, err)
		}
	}
	start := func(id string) {
		t.Helper()
		if _, err := viaOther.Start(ctx, connect.NewRequest(&ledgerv1.StartRequest{ReservationId: id, OperationId: "op-" + id})); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
	}
	settle := func(c capledgerv1connect.LedgerServiceClient, id string, actual int64) (*ledgerv1.SettleResponse, error) {
		res, err := c.Settle(ctx, connect.NewRequest(&ledgerv1.SettleRequest{ReservationId: id, OperationId: "op-" + id, ActualUnits: tokens(actual)}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	release := func(c capledgerv1connect.LedgerServiceClient, id string) (*ledgerv1.ReleaseResponse, error) {
		res, err := c.Release(ctx, connect.NewRequest(&ledgerv1.ReleaseRequest{ReservationId: id}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	// lost runs call, which the lossy replica commits while its COMMIT's
	// answer is lost, and fails the test if the replica claimed success
	// or if no COMMIT carrying id was cut.
	lost := func(id string, call func() error) {
		t.Helper()
		cuts := cutter.cuts.Load()
		cutter.armFor(id)
		err := call()
		if err == nil {
			t.Fatalf("%s: answered success although its COMMIT's answer was lost", id)
		}
		if got := cutter.cuts.Load(); got != cuts+1 {
			t.Fatalf("%s: %d COMMITs cut, want 1 (answered %v)", id, got-cuts, err)
		}
		if code := connect.CodeOf(err); code != connect.CodeUnavailable {
			t.Errorf("%s with its COMMIT's answer lost: %v, want unavailable (outcome unknown, retry with the same ids)", id, err)
		}
	}
	balance := func() *ledgerv1.Balance {
		t.Helper()
		res, err := viaOther.GetAccount(ctx, connect.NewRequest(&ledgerv1.GetAccountRequest{Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region}))
		if err != nil || len(res.Msg.GetAccounts()) != 1 {
			t.Fatalf("account: %v %v", res, err)
		}
		b := res.Msg.GetAccounts()[0].GetBalances()[0]
		if in, out := b.GetOpening()+b.GetMinted()+b.GetOverdraftIssued(),
			b.GetAvailable()+b.GetReserved()+b.GetSpent()+b.GetRetiredForEmergency()+b.GetRetiredForMove()+b.GetOverdraftRepaid(); in != out || b.GetAvailable() < 0 {
			t.Errorf("conservation broken: %v", b)
		}
		return b
	}

	// A settle of 200 of a 600 hold refunds 400; its COMMIT's answer is
	// lost. Its retries replay, refunding nothing.
	mustReserve("refund-settle", 600)
	start("refund-settle")
	lost("refund-settle", func() error { _, err := settle(viaLossy, "refund-settle", 200); return err })
	for _, c := range []capledgerv1connect.LedgerServiceClient{viaLossy, viaOther} {
		res, err := settle(c, "refund-settle", 200)
		if err != nil || !res.GetReplayed() || len(res.GetRefundedUnits()) != 0 || res.GetReservation().GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED {
			t.Errorf("settle retry: %v %v, want a replay refunding nothing", res, err)
		}
	}
	// A release of a 300 hold; its COMMIT's answer is lost.
	mustReserve("refund-release", 300)
	lost("refund-release", func() error { _, err := release(viaLossy, "refund-release"); return err })
	for _, c := range []capledgerv1connect.LedgerServiceClient{viaLossy, viaOther} {
		res, err := release(c, "refund-release")
		if err != nil || !res.GetReplayed() || len(res.GetRefundedUnits()) != 0 {
			t.Errorf("release retry: %v %v, want a replay refunding nothing", res, err)
		}
	}
	if b := balance(); b.GetAvailable() != 800 || b.GetReserved() != 0 || b.GetSpent() != 200 {
		t.Fatalf("after the refunds: %v, want available 800, reserved 0, spent 200", b)
	}

	// 800 more than the 800 available are used: 300 of debt.
	mustReserve("into-debt", 800)
	start("into-debt")
	if res, err := settle(viaOther, "into-debt", 1100); err != nil || res.GetReservation().GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT {
		t.Fatalf("settle into debt: %v %v", res, err)
	}
	if b := balance(); b.GetDebt() != 300 || b.GetOverdraftRepaid() != 0 {
		t.Fatalf("after the overuse: %v, want 300 owed (a slow machine refilled first?)", b)
	}
	if _, err := reserve(viaLossy, "frozen", 1); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("reserve while 300 are owed: %v, want resource exhausted", err)
	}
	// After a refill interval, 500 are minted by the next command on the
	// account: 300 repay the debt, 200 fill available, 100 are reserved.
	// That batch's COMMIT answer is lost; the retries replay its receipt.
	time.Sleep(3100 * time.Millisecond)
	lost("repaying", func() error { _, err := reserve(viaLossy, "repaying", 100); return err })
	for _, c := range []capledgerv1connect.LedgerServiceClient{viaLossy, viaOther} {
		res, err := reserve(c, "repaying", 100)
		if err != nil || !res.GetReplayed() {
			t.Errorf("reserve retry: %v %v, want a replay", res, err)
		}
	}
	if b := balance(); b.GetOverdraftIssued() != 300 || b.GetOverdraftRepaid() != 300 || b.GetReserved() != 100 || b.GetSpent() != 1300 {
		t.Fatalf("after the repayment: %v, want 300 issued and repaid once, 100 reserved, 1300 spent", b)
	}
	audit, err := viaOther.Audit(ctx, connect.NewRequest(&ledgerv1.AuditRequest{}))
	if err != nil || len(audit.Msg.GetDiscrepancies()) != 0 {
		t.Fatalf("audit: %v %v", audit, err)
	}
}

// TestLostCommitAnswerOfADrain: a rolled back generation owes debt and
// holds capacity; the drain that moves both to the generation that decides
// again is run on a replica whose COMMIT answer for it is lost (the seed's
// lost debt-repayment ACK, at a drain). The replica does not claim the
// drain ran; running the drains again there and on the other replica at
// once moves nothing twice: the debt is owed once, on the deciding
// generation, which admits nothing until it is repaid, and the audit is
// clean.
func TestLostCommitAnswerOfADrain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	dsn := schemaDSN(t)
	cutter := newCommitCutter(t, targetOf(t, dsn))
	bin := replicatest.BuildCapledger(t)
	lossy := replicatest.StartReplica(t, bin, cutter.dsnVia(t, dsn))
	other := replicatest.StartReplica(t, bin, dsn)
	ctx := context.Background()
	httpClient := &http.Client{Timeout: 30 * time.Second}
	viaOther := capledgerv1connect.NewLedgerServiceClient(httpClient, "http://"+other.Addr)
	rollouts := func(r *replicatest.Replica) capledgerv1connect.RolloutServiceClient {
		return capledgerv1connect.NewRolloutServiceClient(httpClient, "http://"+r.Addr)
	}
	const subject = "tenant-drain"
	publish := func(burst int64) uint64 {
		t.Helper()
		res, err := viaOther.PublishPolicy(ctx, connect.NewRequest(&ledgerv1.PublishPolicyRequest{Policy: &ledgerv1.Policy{
			Subject: "*", Route: tenant7.Route, Region: tenant7.Region,
			HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(10 * 365 * 24 * time.Hour),
			Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: burst, MaxOverdraft: 1000}},
		}}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetPolicy().GetGeneration()
	}
	g1, g2 := publish(1000), publish(2000)
	reserve := func(id string, n int64) error {
		_, err := viaOther.Reserve(ctx, connect.NewRequest(&ledgerv1.ReserveRequest{ReservationId: id,
			Subject: subject, Route: tenant7.Route, Region: tenant7.Region, Units: map[string]int64{"tokens": n}}))
		return err
	}
	// Under generation 2 (2000 available): 100 reserved and 2300 used,
	// 300 of debt; rolled back, generation 1 decides again.
	if err := reserve("over", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := viaOther.Start(ctx, connect.NewRequest(&ledgerv1.StartRequest{ReservationId: "over", OperationId: "op-over"})); err != nil {
		t.Fatal(err)
	}
	if _, err := viaOther.Settle(ctx, connect.NewRequest(&ledgerv1.SettleRequest{ReservationId: "over", OperationId: "op-over",
		ActualUnits: map[string]int64{"tokens": 2300}})); err != nil {
		t.Fatal(err)
	}
	if _, err := viaOther.RollbackPolicy(ctx, connect.NewRequest(&ledgerv1.RollbackPolicyRequest{Generation: g2})); err != nil {
		t.Fatal(err)
	}

	debtOf := func(generation uint64) int64 {
		t.Helper()
		accounts, err := viaOther.GetAccount(ctx, connect.NewRequest(&ledgerv1.GetAccountRequest{Subject: subject, Route: tenant7.Route, Region: tenant7.Region}))
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range accounts.Msg.GetAccounts() {
			if a.GetPolicyGeneration() == generation {
				return a.GetBalances()[0].GetDebt()
			}
		}
		return 0
	}
	if debt := debtOf(g2); debt != 300 {
		t.Fatalf("generation %d owes %d before the drain, want 300", g2, debt)
	}

	// The drain's COMMIT answer is lost.
	cuts := cutter.cuts.Load()
	cutter.armFor(subject)
	drains := connect.NewRequest(&ledgerv1.DrainProgressRequest{Generations: []uint64{g2}, RunDrains: true})
	res, err := rollouts(lossy).DrainProgress(ctx, drains)
	if err == nil && res.Msg.GetDrainCommands() > 0 {
		t.Fatalf("drain answered %d drains run although its COMMIT's answer was lost", res.Msg.GetDrainCommands())
	}
	t.Logf("the drain whose COMMIT answer was lost answered %v", err)
	if got := cutter.cuts.Load(); got != cuts+1 {
		t.Fatalf("%d COMMITs cut, want the drain's", got-cuts)
	}
	// The drains again, on both replicas at once.
	done := make(chan error, 2)
	for _, r := range []*replicatest.Replica{lossy, other} {
		go func() {
			_, err := rollouts(r).DrainProgress(ctx, connect.NewRequest(&ledgerv1.DrainProgressRequest{Generations: []uint64{g2}, RunDrains: true}))
			done <- err
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("drains run again: %v", err)
		}
	}
	res, err = rollouts(other).DrainProgress(ctx, connect.NewRequest(&ledgerv1.DrainProgressRequest{Generations: []uint64{g2}}))
	if err != nil || !res.Msg.GetDrained() {
		t.Fatalf("generation %d after the drains: %v %v", g2, res, err)
	}
	accounts, err := viaOther.GetAccount(ctx, connect.NewRequest(&ledgerv1.GetAccountRequest{Subject: subject, Route: tenant7.Route, Region: tenant7.Region}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range accounts.Msg.GetAccounts() {
		b := a.GetBalances()[0]
		if in, out := b.GetOpening()+b.GetMinted()+b.GetOverdraftIssued(),
			b.GetAvailable()+b.GetReserved()+b.GetSpent()+b.GetRetiredForEmergency()+b.GetRetiredForMove()+b.GetOverdraftRepaid(); in != out || b.GetAvailable() < 0 {
			t.Errorf("generation %d: conservation broken: %v", a.GetPolicyGeneration(), b)
		}
		if a.GetPolicyGeneration() == g1 && b.GetDebt() != 300 {
			t.Errorf("generation %d owes %d, want the 300 moved to it once: %v", g1, b.GetDebt(), b)
		}
		if a.GetPolicyGeneration() == g2 && (b.GetDebt() != 0 || b.GetAvailable() != 0) {
			t.Errorf("generation %d after the drain: %v, want nothing owed or available", g2, b)
		}
	}
	if err := reserve("frozen", 1); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("reserve while the moved debt is owed: %v, want resource exhausted", err)
	}
	audit, err := viaOther.Audit(ctx, connect.NewRequest(&ledgerv1.AuditRequest{}))
	if err != nil || len(audit.Msg.GetDiscrepancies()) != 0 {
		t.Fatalf("audit: %v %v", audit, err)
	}
}
