package postgres_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
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
	rig, _ := newCommitLossRig(t)
	viaLossy, viaOther, ctx := rig.viaLossy, rig.viaOther, context.Background()
	rig.publish(&ledgerv1.Policy{
		Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region,
		HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(10 * 365 * 24 * time.Hour),
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1000, MaxOverdraft: 1000,
			RefillUnits: 500, RefillInterval: durationpb.New(rigRefillInterval)}},
	})
	reserve := func(c capledgerv1connect.LedgerServiceClient, id string, n int64) (*ledgerv1.ReserveResponse, error) {
		return rig.reserve(c, tenant7.Subject, id, n)
	}
	mustReserve := func(id string, n int64) {
		t.Helper()
		if _, err := reserve(viaOther, id, n); err != nil {
			t.Fatalf("reserve %s: %v", id, err)
		}
	}
	start, settle, lost := rig.start, rig.settle, rig.lost
	release := func(c capledgerv1connect.LedgerServiceClient, id string) (*ledgerv1.ReleaseResponse, error) {
		res, err := c.Release(ctx, connect.NewRequest(&ledgerv1.ReleaseRequest{ReservationId: id}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	balance := func() *ledgerv1.Balance { t.Helper(); return rig.balance(tenant7.Subject) }

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
		t.Fatalf("after the overuse: %v, want 300 owed", b)
	}
	if _, err := reserve(viaLossy, "frozen", 1); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("reserve while 300 are owed: %v, want resource exhausted", err)
	}
	// After a refill interval, 500 are minted by the next command on the
	// account: 300 repay the debt, 200 fill available, 100 are reserved.
	// That batch's COMMIT answer is lost; the retries replay its receipt.
	rig.passRefillInterval(tenant7.Subject)
	lost("repaying", func() error { _, err := reserve(viaLossy, "repaying", 100); return err })
	for _, c := range []capledgerv1connect.LedgerServiceClient{viaLossy, viaOther} {
		res, err := reserve(c, "repaying", 100)
		if err != nil || !res.GetReplayed() {
			t.Errorf("reserve retry: %v %v, want a replay", res, err)
		}
	}
	if b := balance(); b.GetOverdraftIssued() != 300 || b.GetOverdraftRepaid() != 300 || b.GetReserved() != 100 || b.GetSpent() != 1300 ||
		b.GetMinted() != 500 || b.GetAvailable() != 100 {
		t.Fatalf("after the repayment: %v, want 500 minted once: 300 issued and repaid once, 100 reserved of the 200 it made available, 1300 spent", b)
	}
	rig.audit()
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
	rig, _ := newCommitLossRig(t)
	lossy, other, cutter, viaOther := rig.lossy, rig.other, rig.cutter, rig.viaOther
	ctx := context.Background()
	httpClient := &http.Client{Timeout: 30 * time.Second}
	rollouts := func(r *replicatest.Replica) capledgerv1connect.RolloutServiceClient {
		return capledgerv1connect.NewRolloutServiceClient(httpClient, "http://"+r.Addr)
	}
	const subject = "tenant-drain"
	publish := func(burst int64) uint64 {
		t.Helper()
		return rig.publish(&ledgerv1.Policy{
			Subject: "*", Route: tenant7.Route, Region: tenant7.Region,
			HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(10 * 365 * 24 * time.Hour),
			Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: burst, MaxOverdraft: 1000}},
		})
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
	rig.audit()
}

// commitLossRig is two `capledger serve` replicas on one fresh schema, the
// first (lossy) reaching PostgreSQL through a commitCutter and started
// first, so that it holds the worker lease, and clients of both.
type commitLossRig struct {
	t                  *testing.T
	dsn                string // the schema's, direct
	cutter             *commitCutter
	lossy, other       *replicatest.Replica
	viaLossy, viaOther capledgerv1connect.LedgerServiceClient
	console            capledgerv1connect.ConsoleServiceClient
}

// newCommitLossRig starts the rig. The policies given are published
// before the other replica starts, and the lossy one is restarted after
// publishing them, so that its epoch worker has read them when it starts:
// the worker looks for ended epochs every second only among the policies
// its last (minutely) pass read. It returns their generations in order.
func newCommitLossRig(t *testing.T, policies ...*ledgerv1.Policy) (*commitLossRig, []uint64) {
	t.Helper()
	dsn := schemaDSN(t)
	rig := &commitLossRig{t: t, dsn: dsn, cutter: newCommitCutter(t, targetOf(t, dsn))}
	bin := replicatest.BuildCapledger(t)
	rig.lossy = replicatest.StartReplica(t, bin, rig.cutter.dsnVia(t, dsn))
	httpClient := &http.Client{Timeout: 30 * time.Second}
	rig.viaLossy = capledgerv1connect.NewLedgerServiceClient(httpClient, "http://"+rig.lossy.Addr)
	var generations []uint64
	if len(policies) > 0 {
		for _, p := range policies {
			res, err := rig.viaLossy.PublishPolicy(context.Background(), connect.NewRequest(&ledgerv1.PublishPolicyRequest{Policy: p}))
			if err != nil {
				t.Fatal(err)
			}
			generations = append(generations, res.Msg.GetPolicy().GetGeneration())
		}
		rig.lossy.Stop()
		rig.lossy.Start()
	}
	rig.waitLeader(rig.lossy)
	rig.other = replicatest.StartReplica(t, bin, dsn)
	rig.viaOther = capledgerv1connect.NewLedgerServiceClient(httpClient, "http://"+rig.other.Addr)
	rig.console = capledgerv1connect.NewConsoleServiceClient(httpClient, "http://"+rig.other.Addr)
	return rig, generations
}

// waitLeader waits until r says (GET /statusz) it holds the worker lease.
func (rig *commitLossRig) waitLeader(r *replicatest.Replica) {
	rig.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var status struct {
			Workers struct {
				Leader bool `json:"leader"`
			} `json:"workers"`
		}
		if resp, err := http.Get("http://" + r.Addr + "/statusz"); err == nil {
			err = json.NewDecoder(resp.Body).Decode(&status)
			resp.Body.Close()
			if err == nil && status.Workers.Leader {
				return
			}
		}
		if time.Now().After(deadline) {
			rig.t.Fatalf("replica %s does not hold the worker lease:\n%s", r.Addr, r.Logs.String())
		}
	}
}

func (rig *commitLossRig) publish(p *ledgerv1.Policy) uint64 {
	rig.t.Helper()
	res, err := rig.viaOther.PublishPolicy(context.Background(), connect.NewRequest(&ledgerv1.PublishPolicyRequest{Policy: p}))
	if err != nil {
		rig.t.Fatal(err)
	}
	return res.Msg.GetPolicy().GetGeneration()
}

func (rig *commitLossRig) reserve(c capledgerv1connect.LedgerServiceClient, subject, id string, n int64) (*ledgerv1.ReserveResponse, error) {
	res, err := c.Reserve(context.Background(), connect.NewRequest(&ledgerv1.ReserveRequest{ReservationId: id,
		Subject: subject, Route: tenant7.Route, Region: tenant7.Region, Units: map[string]int64{"tokens": n}}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// start starts id (operation "op-"+id) through the other replica.
func (rig *commitLossRig) start(id string) {
	rig.t.Helper()
	if _, err := rig.viaOther.Start(context.Background(), connect.NewRequest(&ledgerv1.StartRequest{ReservationId: id, OperationId: "op-" + id})); err != nil {
		rig.t.Fatalf("start %s: %v", id, err)
	}
}

func (rig *commitLossRig) settle(c capledgerv1connect.LedgerServiceClient, id string, actual int64) (*ledgerv1.SettleResponse, error) {
	res, err := c.Settle(context.Background(), connect.NewRequest(&ledgerv1.SettleRequest{ReservationId: id, OperationId: "op-" + id,
		ActualUnits: map[string]int64{"tokens": actual}}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// lost runs call, which the lossy replica commits while its COMMIT's
// answer is lost, and fails the test if the replica claimed success or if
// no COMMIT carrying id was cut.
func (rig *commitLossRig) lost(id string, call func() error) {
	rig.t.Helper()
	cuts := rig.cutter.cuts.Load()
	rig.cutter.armFor(id)
	err := call()
	if err == nil {
		rig.t.Fatalf("%s: answered success although its COMMIT's answer was lost", id)
	}
	if got := rig.cutter.cuts.Load(); got != cuts+1 {
		rig.t.Fatalf("%s: %d COMMITs cut, want 1 (answered %v)", id, got-cuts, err)
	}
	if code := connect.CodeOf(err); code != connect.CodeUnavailable {
		rig.t.Errorf("%s with its COMMIT's answer lost: %v, want unavailable (outcome unknown, retry with the same ids)", id, err)
	}
}

// balance returns the tokens balance of the subject's one account (as
// GetAccount shows it: with the refill due up to now), failing the test
// if it breaks conservation.
func (rig *commitLossRig) balance(subject string) *ledgerv1.Balance {
	rig.t.Helper()
	res, err := rig.viaOther.GetAccount(context.Background(), connect.NewRequest(&ledgerv1.GetAccountRequest{Subject: subject, Route: tenant7.Route, Region: tenant7.Region}))
	if err != nil || len(res.Msg.GetAccounts()) != 1 {
		rig.t.Fatalf("account: %v %v", res, err)
	}
	b := res.Msg.GetAccounts()[0].GetBalances()[0]
	if in, out := b.GetOpening()+b.GetMinted()+b.GetOverdraftIssued(),
		b.GetAvailable()+b.GetReserved()+b.GetSpent()+b.GetRetiredForEmergency()+b.GetRetiredForMove()+b.GetOverdraftRepaid(); in != out || b.GetAvailable() < 0 {
		rig.t.Errorf("conservation broken: %v", b)
	}
	return b
}

// rigRefillInterval is the refill interval of the rig's refilling
// policies: a day, so that no refill is due by the clock while a test
// runs, however slow the machine. A test makes one due when it wants it
// (passRefillInterval), so what it sees before and after does not depend
// on how fast the replicas answered.
const rigRefillInterval = 24 * time.Hour

// passRefillInterval makes the refill of one interval due on the
// subject's account, as if rigRefillInterval had passed since its last
// refill: it moves the account's refill cursor (account_terms.refilled_to,
// nanoseconds) back by the interval, directly in the database. The
// replicas read the account's rows in every transaction and keep no copy
// between them, so the next command on the account mints the interval's
// refill, exactly as after the wait. It changes no term and writes no
// journal entry: only the time the ledger counts refills from.
func (rig *commitLossRig) passRefillInterval(subject string) {
	rig.t.Helper()
	conn, err := pgx.Connect(context.Background(), rig.dsn)
	if err != nil {
		rig.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tag, err := conn.Exec(context.Background(), `UPDATE account_terms SET refilled_to = refilled_to - $1
		WHERE account_id IN (SELECT id FROM accounts WHERE subject = $2 AND route = $3 AND region = $4)`,
		int64(rigRefillInterval), subject, tenant7.Route, tenant7.Region)
	if err != nil || tag.RowsAffected() != 1 {
		rig.t.Fatalf("move the refill cursor of %s back: %v (%d rows), want the one account's one dimension", subject, err, tag.RowsAffected())
	}
}

// audit fails the test unless the ledger's audit is clean.
func (rig *commitLossRig) audit() {
	rig.t.Helper()
	audit, err := rig.viaOther.Audit(context.Background(), connect.NewRequest(&ledgerv1.AuditRequest{}))
	if err != nil || len(audit.Msg.GetDiscrepancies()) != 0 {
		rig.t.Fatalf("audit: %v %v", audit, err)
	}
}

// TestLostCommitAnswerOfTheEpochWorkersCloseAndTheNextEpochsRepayment: an
// account goes 300 into debt; its epoch ends and the epoch worker, on the
// replica holding the worker lease, closes it (the statement of an epoch
// that ends owing 300) while its COMMIT's answer is lost, so the worker
// does not know whether the close happened. The worker does not close it
// again (one statement for the epoch). In a later epoch the refill repays
// the debt, in the batch of the first reserve, which closes the epochs
// between (a second statement opening on the first's closing) and whose
// COMMIT's answer is lost too; the gateway's retries on both replicas
// replay it. The 300 are owed once and repaid once, every statement
// chains onto the one before, and the audit is clean. (The worker itself
// only closes epochs: ledger.CloseEpoch does not refill, so the debt is
// repaid by the epoch's first command, or by a drain.)
func TestLostCommitAnswerOfTheEpochWorkersCloseAndTheNextEpochsRepayment(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	const subject = "tenant-epoch"
	rig, generations := newCommitLossRig(t, &ledgerv1.Policy{
		Subject: subject, Route: tenant7.Route, Region: tenant7.Region,
		HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(time.Second),
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1000, MaxOverdraft: 1000,
			RefillUnits: 500, RefillInterval: durationpb.New(rigRefillInterval)}},
	})
	ctx, generation := context.Background(), generations[0]
	// 1,300 used of a 1,000 hold: 300 owed, which no refill repays until
	// the test makes one due.
	if _, err := rig.reserve(rig.viaOther, subject, "into-debt", 1000); err != nil {
		t.Fatal(err)
	}
	rig.start("into-debt")
	if res, err := rig.settle(rig.viaOther, "into-debt", 1300); err != nil || res.GetReservation().GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT {
		t.Fatalf("settle into debt: %v %v", res, err)
	}
	// The next COMMIT carrying the subject is the epoch worker's close of
	// the settle's epoch, on the lossy replica: the gateway sends nothing
	// meanwhile, and an epoch in which the account changed is closed by
	// the worker soon after it ends.
	rig.cutter.armFor(subject)
	if b := rig.balance(subject); b.GetDebt() != 300 {
		t.Fatalf("after the overuse: %v, want 300 owed", b)
	}
	for deadline := time.Now().Add(30 * time.Second); rig.cutter.cuts.Load() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the epoch worker closed no epoch of %s in 30 s:\n%s", subject, rig.lossy.Logs.String())
		}
	}
	// The worker logs its failed batch; it does not know the outcome.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(rig.lossy.Logs.String(), "worker batch"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not log its failed batch:\n%s", rig.lossy.Logs.String())
		}
	}
	statements := func() []*ledgerv1.Statement {
		t.Helper()
		res, err := rig.console.ListStatements(ctx, connect.NewRequest(&ledgerv1.ListStatementsRequest{
			Subject: subject, Route: tenant7.Route, Region: tenant7.Region, PolicyGeneration: generation, PageSize: 1000}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetStatements()
	}
	// Newest first: the worker's closes the epoch owing 300.
	closed := statements()
	if len(closed) == 0 || closed[0].GetClosing()[0].GetDebt() != 300 {
		t.Fatalf("statements after the worker's close: %v, want the newest closing 300 owed", closed)
	}

	// A refill interval later, the first reserve mints 500: 300 repay the
	// debt, 200 fill available. Its COMMIT's answer is lost; the retries
	// on both replicas replay it. It comes once the epoch the worker's
	// close opened (a second long) has ended, so that its batch closes
	// that epoch too: later only means more idle epochs in its statement.
	rig.passRefillInterval(subject)
	time.Sleep(time.Until(closed[0].GetEpochEnd().AsTime().Add(time.Second)))
	rig.lost("repaying", func() error { _, err := rig.reserve(rig.viaLossy, subject, "repaying", 100); return err })
	for _, c := range []capledgerv1connect.LedgerServiceClient{rig.viaLossy, rig.viaOther} {
		if res, err := rig.reserve(c, subject, "repaying", 100); err != nil || !res.GetReplayed() {
			t.Errorf("reserve retry: %v %v, want a replay", res, err)
		}
	}
	if b := rig.balance(subject); b.GetOverdraftIssued() != 300 || b.GetOverdraftRepaid() != 300 || b.GetReserved() != 100 || b.GetSpent() != 1300 ||
		b.GetMinted() != 500 || b.GetAvailable() != 100 {
		t.Fatalf("after the repayment: %v, want 500 minted once: 300 owed and repaid once, 100 reserved of the 200 it made available, 1,300 spent", b)
	}
	// The reserve's batch closed the idle epochs since the worker's close
	// in one statement, still owing 300 (the refill came after, in the
	// epoch of now). Each statement opens on the closing of the one before
	// and starts where it ended; the epoch the worker closed has one.
	after := statements()
	if len(after) != len(closed)+1 || after[0].GetClosing()[0].GetDebt() != 300 {
		t.Fatalf("statements after the repaying reserve: %v, want one more than the %d before, closing 300 owed", after, len(closed))
	}
	worker := 0
	for i := range after {
		if after[i].GetEpochStart().AsTime().Equal(closed[0].GetEpochStart().AsTime()) {
			worker++
		}
		if i+1 < len(after) && (!proto.Equal(after[i].GetOpening()[0], after[i+1].GetClosing()[0]) ||
			!after[i].GetEpochStart().AsTime().Equal(after[i+1].GetEpochEnd().AsTime())) {
			t.Errorf("statement %d (%v) does not follow on the one before (%v)", i, after[i], after[i+1])
		}
	}
	if worker != 1 {
		t.Errorf("the epoch the worker closed has %d statements, want 1: %v", worker, after)
	}
	rig.audit()
}
