package envoyrls_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/envoyrls"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/memstore"

	"connectrpc.com/connect"
	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// BenchmarkShouldRateLimit is the adapter's own cost per classic check
// (reserve + start + settle in one engine call, on the in-memory store),
// without the network: compare with server's BenchmarkReserve.
func BenchmarkShouldRateLimit(b *testing.B) {
	st := memstore.New()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.New(st, engine.Options{DisableWorkers: true, Logger: logger})
	defer eng.Close()
	srv := server.New(eng, server.Config{Logger: logger})
	cfg, err := envoyrls.ParseConfig([]byte("domains: [{name: bench, rules: [{subject: {key: tenant}, route: {value: bench}, unit: tokens}]}]"))
	if err != nil {
		b.Fatal(err)
	}
	svc := envoyrls.New(srv, cfg, logger)
	ctx := context.Background()
	if _, err := srv.PublishPolicy(ctx, connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: ledger.AnySubject, Route: "bench",
		Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1 << 40, RefillInterval: durationpb.New(time.Second)}},
		HoldTtl:    durationpb.New(time.Hour),
	}})); err != nil {
		b.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "t1")}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := svc.ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			b.Fatalf("%v %v", resp, err)
		}
	}
}
