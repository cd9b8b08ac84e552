package server_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/memstore"
)

// goroutineProbe answers health checks and records the goroutine of each.
type goroutineProbe struct {
	healthpb.UnimplementedHealthServer
	mu  sync.Mutex
	ids map[string]bool
}

func (p *goroutineProbe) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	p.mu.Lock()
	p.ids[string(id)] = true
	p.mu.Unlock()
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// TestGRPCCallsReuseGoroutines: the grpc-go server keeps goroutines for
// calls (NumStreamWorkers) rather than starting one per call, whose stack
// would grow from the minimum each time: 200 calls one after the other
// run on at most 64 goroutines (goroutine ids are never reused, so a
// goroutine per call would show 200).
func TestGRPCCallsReuseGoroutines(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.New(memstore.New(), engine.Options{DisableWorkers: true, Logger: logger})
	defer eng.Close()
	gs := server.New(eng, server.Config{Logger: logger}).GRPCServer(server.GRPCOptions{})
	probe := &goroutineProbe{ids: map[string]bool{}}
	healthpb.RegisterHealthServer(gs, probe)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	const calls = 200
	for range calls {
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(probe.ids); n > 64 {
		t.Fatalf("%d calls ran on %d goroutines; want at most 64 (kept for calls)", calls, n)
	}
}
