//go:build unix

package envoyrls_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/envoyrls"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/memstore"
)

// okService answers every ShouldRateLimit with OK at once: the transport
// alone, without the ledger.
type okService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (okService) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// BenchmarkTransport compares the ways of serving ShouldRateLimit: on the
// net/http port the LedgerService uses, connect-go's gRPC protocol (what
// envoyrls mounts) and grpc-go's (*grpc.Server).ServeHTTP, both behind
// server.HTTPServer's h2c; grpc-go's own transport,
// (*grpc.Server).Serve on a listener of its own (the upper bound of
// sniffing connections onto it); and server.Front as serve runs it, with
// ShouldRateLimit through grpc-go's bridge to the connect handler
// (front-bridge) or registered on grpc-go directly (front-direct). Each is
// driven by the grpc-go client of go-control-plane over a real socket, 64
// calls in flight. It reports the process's CPU per call (client and
// server together).
func BenchmarkTransport(b *testing.B) {
	handlers := map[string]http.Handler{
		"connect": connect.NewUnaryHandler(envoyrls.Procedure, func(ctx context.Context, req *connect.Request[rlsv3.RateLimitRequest]) (*connect.Response[rlsv3.RateLimitResponse], error) {
			resp, err := okService{}.ShouldRateLimit(ctx, req.Msg)
			return connect.NewResponse(resp), err
		}),
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, okService{})
	handlers["grpc-go-ServeHTTP"] = gs
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.New(memstore.New(), engine.Options{DisableWorkers: true, Logger: logger})
	defer eng.Close()
	for _, name := range []string{"connect", "grpc-go-ServeHTTP", "grpc-go-Serve", "front-bridge", "front-direct"} {
		b.Run(name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			switch name {
			case "grpc-go-Serve":
				native := grpc.NewServer()
				rlsv3.RegisterRateLimitServiceServer(native, okService{})
				go native.Serve(ln)
				defer native.Stop()
			case "front-bridge", "front-direct":
				srv := server.New(eng, server.Config{Logger: logger})
				srv.Mount(envoyrls.Procedure, handlers["connect"])
				gs := srv.GRPCServer(server.GRPCOptions{})
				if name == "front-direct" {
					rlsv3.RegisterRateLimitServiceServer(gs, okService{})
				}
				front := &server.Front{HTTP: server.HTTPServer(srv.Handler(), logger), GRPC: gs, Log: logger}
				go front.Serve(ln)
				defer front.Shutdown(context.Background())
			default:
				srv := server.HTTPServer(handlers[name], slog.New(slog.NewTextHandler(io.Discard, nil)))
				go srv.Serve(ln)
				defer srv.Close()
			}
			conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "t1")}}
			b.SetParallelism(32) // 64 goroutines on 2 Ps
			var before syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &before)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := client.ShouldRateLimit(ctx, req)
					cancel()
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			var after syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &after)
			cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
