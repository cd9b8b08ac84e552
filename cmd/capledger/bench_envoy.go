package main

import (
	"context"
	"fmt"
	"strings"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/capledger/capledger/client"
)

// envoyOp calls ShouldRateLimit with go-control-plane's generated grpc-go
// client (the one Envoy control planes and envoyproxy/ratelimit's own
// tests use), so that the same load generator drives capledger (serve
// --envoy-config) and the reference envoyproxy/ratelimit alike: one
// descriptor {tenant: subject} of domain --envoy-domain with hits
// --units per call, over one HTTP/2 connection, as Envoy's ratelimit
// cluster does. Against capledger it first publishes the bench policy
// (unless --setup=false); the mapping file must map the domain's tenant
// key to --route and unit tokens (docs/ENVOY.md, "Benchmark").
func envoyOp(ctx context.Context, cfg *benchConfig) (func(context.Context, *benchWorker) (int, error), error) {
	if cfg.setup {
		if _, err := ledgerOp(ctx, cfg); err != nil {
			return nil, err
		}
	}
	conn, err := grpcGoConn(cfg, "envoy")
	if err != nil {
		return nil, err
	}
	rls := rlsv3.NewRateLimitServiceClient(conn)
	var md metadata.MD
	if cfg.conn.token != "" {
		md = metadata.Pairs("authorization", "Bearer "+cfg.conn.token)
	}
	hits := uint32(cfg.units)
	return func(ctx context.Context, w *benchWorker) (int, error) {
		if md != nil {
			ctx = metadata.NewOutgoingContext(ctx, md)
		}
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain:     cfg.envoyDomain,
			HitsAddend: hits,
			Descriptors: []*rlscommon.RateLimitDescriptor{{Entries: []*rlscommon.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: w.subject(cfg)},
			}}},
		})
		if err != nil {
			return 0, err
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			return 0, &client.RejectedError{}
		}
		return 1, nil
	}, nil
}

// grpcGoConn is one grpc-go client connection to --addr (http:// or none
// for cleartext h2c, https:// for TLS with --ca-file, --cert and --key), as Envoy's cluster
// and gRPC gateways keep one.
func grpcGoConn(cfg *benchConfig, what string) (*grpc.ClientConn, error) {
	target := cfg.conn.addr
	creds := insecure.NewCredentials()
	switch {
	case strings.HasPrefix(target, "https://"):
		tc, err := cfg.conn.clientTLS()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
		target = strings.TrimPrefix(target, "https://")
	default:
		target = strings.TrimPrefix(target, "http://")
	}
	conn, err := grpc.NewClient(strings.TrimRight(target, "/"), grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return conn, nil
}
