package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

const legacyToken = "legacy-token-0123456789"

// legacyServer serves, over a real socket, a server on a SQLite store with
// shards on and three tokens: an admin (ops), gateway gw-1 and the legacy
// limiter's gateway token; it returns its URL.
func legacyServer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.New(st, engine.Options{DisableWorkers: true, Logger: logger})
	t.Cleanup(func() { eng.Close(); st.Close() })
	keys, _, err := server.EnsureShardKeys(filepath.Join(dir, "shard-keys"))
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := server.ParseTokens(strings.NewReader(
		shardAdminToken + " admin ops\n" + gw1Token + " gateway gw-1\n" + legacyToken + " gateway legacy-limiter\n"))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, server.New(eng, server.Config{Logger: logger, Tokens: tokens, Rollouts: st, Drains: eng,
		Shards: &server.ShardConfig{Keys: keys, MaxTTL: time.Hour}}))
	return url
}

// The legacy limiter's budget over a real server with auth on: only an
// admin carves it, with emergency mode off; it is bound to the legacy
// limiter's token, which alone (besides an admin) reconciles it; a
// reconciliation that would return the whole block is refused; the
// confirmed-unused units come back; the audit finds nothing.
func TestLegacyBudgetOverTheAPI(t *testing.T) {
	url := legacyServer(t)
	hc := &http.Client{Timeout: 10 * time.Second}
	rolloutAs := func(token string) capledgerv1connect.RolloutServiceClient {
		return capledgerv1connect.NewRolloutServiceClient(hc, url, connect.WithInterceptors(bearer(token)))
	}
	shardsAs := func(token string) capledgerv1connect.ShardServiceClient {
		return capledgerv1connect.NewShardServiceClient(hc, url, connect.WithInterceptors(bearer(token)))
	}
	ledgerAdmin := capledgerv1connect.NewLedgerServiceClient(hc, url, connect.WithInterceptors(bearer(shardAdminToken)))
	h := &shardHarness{ledger: ledgerAdmin}
	h.publish(t, false) // emergency mode off
	ctx := context.Background()
	carve := &v1.CarveLegacyBudgetRequest{BudgetId: "legacy-t7", Identity: "legacy-limiter", Subject: "tenant-7", Route: "chat.generate",
		Region: "eu", Units: map[string]int64{"tokens": 200}, Ttl: durationpb.New(30 * time.Minute)}

	_, err := rolloutAs(gw1Token).CarveLegacyBudget(ctx, connect.NewRequest(carve))
	wantShardError(t, err, connect.CodePermissionDenied, server.ReasonPermissionDenied)
	// An identity whose gateway id (legacy:<identity>) would pass the id
	// bound is refused: no ReconcileShard could name that budget.
	long := &v1.CarveLegacyBudgetRequest{BudgetId: "legacy-long", Identity: strings.Repeat("i", ledger.MaxIDBytes-len(ledger.LegacyGatewayPrefix)+1),
		Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: map[string]int64{"tokens": 1}, Ttl: durationpb.New(time.Minute)}
	_, err = rolloutAs(shardAdminToken).CarveLegacyBudget(ctx, connect.NewRequest(long))
	wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonInvalidCommand)
	_, err = rolloutAs(legacyToken).CarveLegacyBudget(ctx, connect.NewRequest(carve))
	wantShardError(t, err, connect.CodePermissionDenied, server.ReasonPermissionDenied)
	// Shard issuance for the legacy gateway id is no way around it.
	_, err = shardsAs(legacyToken).IssueShard(ctx, connect.NewRequest(issueRequest("sneak", "legacy:legacy-limiter", 10)))
	wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonInvalidCommand)

	resp, err := rolloutAs(shardAdminToken).CarveLegacyBudget(ctx, connect.NewRequest(carve))
	if err != nil {
		t.Fatal(err)
	}
	b := resp.Msg.GetBudget()
	if b.GetGatewayId() != "legacy:legacy-limiter" || b.GetAllocatedUnits()["tokens"] != 200 || !b.GetSignatureValid() {
		t.Fatalf("carved %v", b)
	}
	again, err := rolloutAs(shardAdminToken).CarveLegacyBudget(ctx, connect.NewRequest(carve))
	if err != nil || !again.Msg.GetReplayed() {
		t.Fatalf("retried carve: %v, %v", again, err)
	}

	receipts := []*v1.ShardReceipt{
		{ReservationId: "l-1", State: v1.ReservationState_RESERVATION_STATE_SETTLED, ReservedUnits: map[string]int64{"tokens": 120}, ActualUnits: map[string]int64{"tokens": 110}},
		{ReservationId: "l-2", State: v1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN, ReservedUnits: map[string]int64{"tokens": 50}},
	}
	_, err = shardsAs(gw1Token).ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "legacy-t7", GatewayId: "legacy:legacy-limiter", Receipts: receipts}))
	wantShardError(t, err, connect.CodePermissionDenied, server.ReasonPermissionDenied)
	_, err = shardsAs(legacyToken).ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "legacy-t7", GatewayId: "legacy:legacy-limiter"}))
	wantShardError(t, err, connect.CodeFailedPrecondition, server.ReasonLegacyWholeBlock)
	rec, err := shardsAs(legacyToken).ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "legacy-t7", GatewayId: "legacy:legacy-limiter", Receipts: receipts}))
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.Msg.GetRemintedUnits()["tokens"]; got != 40 {
		t.Fatalf("reminted %d, want the 40 confirmed unused", got)
	}
	audit, err := ledgerAdmin.Audit(ctx, connect.NewRequest(&v1.AuditRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(audit.Msg.GetDiscrepancies()); n != 0 {
		t.Fatalf("audit: %v", audit.Msg.GetDiscrepancies())
	}
}

// A legacy limiter that overspent its carve (receipts above the budget)
// is charged, not forgiven: the reconcile answers the excess as debtUnits,
// the subject's available repays what it can at once, and the rest
// freezes the subject's admission (docs/ROLLOUT.md, section 5).
func TestLegacyBudgetOverspendIsChargedAsDebt(t *testing.T) {
	url := legacyServer(t)
	hc := &http.Client{Timeout: 10 * time.Second}
	rollouts := capledgerv1connect.NewRolloutServiceClient(hc, url, connect.WithInterceptors(bearer(shardAdminToken)))
	legacyShards := capledgerv1connect.NewShardServiceClient(hc, url, connect.WithInterceptors(bearer(legacyToken)))
	gateway := capledgerv1connect.NewLedgerServiceClient(hc, url, connect.WithInterceptors(bearer(gw1Token)))
	h := &shardHarness{ledger: capledgerv1connect.NewLedgerServiceClient(hc, url, connect.WithInterceptors(bearer(shardAdminToken)))}
	h.publish(t, false) // burst 1000 tokens
	ctx := context.Background()

	if _, err := rollouts.CarveLegacyBudget(ctx, connect.NewRequest(&v1.CarveLegacyBudgetRequest{BudgetId: "legacy-over",
		Identity: "legacy-limiter", Subject: "tenant-7", Route: "chat.generate", Region: "eu",
		Units: map[string]int64{"tokens": 200}, Ttl: durationpb.New(30 * time.Minute)})); err != nil {
		t.Fatal(err)
	}
	// 790 of the 800 left are held by a gateway: 10 stay available.
	if _, err := gateway.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{ReservationId: "held", Subject: "tenant-7",
		Route: "chat.generate", Region: "eu", Units: map[string]int64{"tokens": 790, "requests": 1}})); err != nil {
		t.Fatal(err)
	}
	rec, err := legacyShards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "legacy-over",
		GatewayId: "legacy:legacy-limiter", Receipts: []*v1.ShardReceipt{{ReservationId: "l-over",
			State:         v1.ReservationState_RESERVATION_STATE_SETTLED,
			ReservedUnits: map[string]int64{"tokens": 300}, ActualUnits: map[string]int64{"tokens": 300}}}}))
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.Msg.GetDebtUnits()["tokens"]; got != 100 {
		t.Fatalf("debtUnits %d, want the 100 spent beyond the 200 carved", got)
	}
	if got := rec.Msg.GetRemintedUnits()["tokens"]; got != 0 {
		t.Fatalf("reminted %d of an overspent budget", got)
	}
	acct, err := h.ledger.GetAccount(ctx, connect.NewRequest(&v1.GetAccountRequest{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acct.Msg.GetAccounts() {
		for _, bal := range a.GetBalances() {
			if bal.GetUnit() == "tokens" && (bal.GetOverdraftIssued() != 100 || bal.GetOverdraftRepaid() != 10 || bal.GetAvailable() != 0) {
				t.Fatalf("tokens after the overspend: %v, want 100 issued, the 10 available repaid at once", bal)
			}
		}
	}
	_, err = gateway.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{ReservationId: "after", Subject: "tenant-7",
		Route: "chat.generate", Region: "eu", Units: map[string]int64{"tokens": 1, "requests": 1}}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "admission frozen") {
		t.Fatalf("reserve after the overspend: %v, want admission frozen by the debt", err)
	}
	audit, err := h.ledger.Audit(ctx, connect.NewRequest(&v1.AuditRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(audit.Msg.GetDiscrepancies()); n != 0 {
		t.Fatalf("audit: %v", audit.Msg.GetDiscrepancies())
	}
}
