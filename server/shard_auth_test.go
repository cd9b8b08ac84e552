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

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

const (
	shardAdminToken = "shard-admin-token-0123456789"
	gw1Token        = "gw-1-token-0123456789"
	gw2Token        = "gw-2-token-0123456789"
)

// bearer adds a token to every call of a client.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}
func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}
func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestShardCallsBoundToTheTokensGateway checks over a real server with
// auth on that a gateway token issues and reconciles shards only for the
// gateway id equal to its token name, that a refused call carves or
// settles nothing, and that an admin token may act for any gateway.
func TestShardCallsBoundToTheTokensGateway(t *testing.T) {
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
		shardAdminToken + " admin ops\n" + gw1Token + " gateway gw-1\n" + gw2Token + " gateway gw-2\n"))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, server.New(eng, server.Config{Logger: logger, Tokens: tokens,
		Shards: &server.ShardConfig{Keys: keys, MaxTTL: time.Hour}}))
	hc := &http.Client{Timeout: 10 * time.Second}
	shardsAs := func(token string) capledgerv1connect.ShardServiceClient {
		return capledgerv1connect.NewShardServiceClient(hc, url, connect.WithInterceptors(bearer(token)))
	}
	admin, gw1, gw2 := shardsAs(shardAdminToken), shardsAs(gw1Token), shardsAs(gw2Token)
	ledgerAdmin := capledgerv1connect.NewLedgerServiceClient(hc, url, connect.WithInterceptors(bearer(shardAdminToken)))
	h := &shardHarness{ledger: ledgerAdmin}
	h.publish(t, true)
	ctx := context.Background()

	available := func() int64 {
		t.Helper()
		resp, err := ledgerAdmin.GetAccount(ctx, connect.NewRequest(&v1.GetAccountRequest{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.Accounts) == 0 {
			return 1000 // no account yet: a full burst
		}
		for _, b := range resp.Msg.Accounts[len(resp.Msg.Accounts)-1].Balances {
			if b.Unit == "tokens" {
				return b.Available
			}
		}
		t.Fatal("no tokens balance")
		return 0
	}

	// gw-1 for itself: issued.
	if _, err := gw1.IssueShard(ctx, connect.NewRequest(issueRequest("sh-gw1", "gw-1", 100))); err != nil {
		t.Fatalf("gw-1 issuing for gw-1: %v", err)
	}
	before := available()
	// gw-1 for gw-2: refused, nothing carved, no shard recorded.
	_, err = gw1.IssueShard(ctx, connect.NewRequest(issueRequest("sh-stolen", "gw-2", 100)))
	wantShardError(t, err, connect.CodePermissionDenied, server.ReasonPermissionDenied)
	if after := available(); after != before {
		t.Fatalf("a refused issuance moved capacity: available %d -> %d", before, after)
	}
	_, err = admin.GetShard(ctx, connect.NewRequest(&v1.GetShardRequest{ShardId: "sh-stolen"}))
	wantShardError(t, err, connect.CodeNotFound, server.ReasonShardNotFound)

	// Admin for gw-2: issued.
	if _, err := admin.IssueShard(ctx, connect.NewRequest(issueRequest("sh-gw2", "gw-2", 100))); err != nil {
		t.Fatalf("admin issuing for gw-2: %v", err)
	}

	// gw-1 reconciling gw-2's shard as gw-2: refused, the shard stays
	// unreconciled. As itself it passes auth and the ledger refuses the
	// shard as foreign.
	_, err = gw1.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-gw2", GatewayId: "gw-2"}))
	wantShardError(t, err, connect.CodePermissionDenied, server.ReasonPermissionDenied)
	_, err = gw1.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-gw2", GatewayId: "gw-1"}))
	wantShardError(t, err, connect.CodeFailedPrecondition, server.ReasonShardForeign)
	got, err := admin.GetShard(ctx, connect.NewRequest(&v1.GetShardRequest{ShardId: "sh-gw2"}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.Shard.Reconciled {
		t.Fatal("a refused reconciliation reconciled the shard")
	}

	// Each gateway reconciles its own; an admin may reconcile for anyone.
	if _, err := gw2.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-gw2", GatewayId: "gw-2"})); err != nil {
		t.Fatalf("gw-2 reconciling its own shard: %v", err)
	}
	if _, err := admin.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-gw1", GatewayId: "gw-1"})); err != nil {
		t.Fatalf("admin reconciling gw-1's shard: %v", err)
	}

	// No token at all is unauthenticated, whatever the gateway id.
	_, err = capledgerv1connect.NewShardServiceClient(hc, url).IssueShard(ctx, connect.NewRequest(issueRequest("sh-anon", "gw-1", 1)))
	wantShardError(t, err, connect.CodeUnauthenticated, server.ReasonUnauthenticated)
}
