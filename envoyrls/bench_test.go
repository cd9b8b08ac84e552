//go:build unix

package envoyrls_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
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
	"github.com/capledger/capledger/store/sqlite"

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

// BenchmarkCheckCommands is what the durable classic check costs against
// a plain reserve: 64 callers run either one reserve or the check's
// reserve + start + settle (one engine call, one SQLite transaction, one
// fsync per group commit) through the server's Run, on SQLite, and it
// reports the process's CPU per call. The difference is the price of the
// two extra commands (their ledger steps and journal rows). The variant
// ShouldRateLimit runs the whole adapter (descriptor mapping, the same
// three commands, the answer with its headers) in-process: its difference
// to reserve+start+settle is the adapter's own cost. The variants
// ending in "/goroutine" run each call on a goroutine of its own, as
// grpc-go runs each call: they add what growing a new goroutine's stack
// costs at each depth.
//
//	go test -run '^$' -bench CheckCommands -benchtime 5000x ./envoyrls/
func BenchmarkCheckCommands(b *testing.B) {
	for _, name := range []string{"reserve", "reserve+start+settle", "ShouldRateLimit", "reserve+start+settle/goroutine", "ShouldRateLimit/goroutine"} {
		variant, perCall, _ := strings.Cut(name, "/")
		b.Run(name, func(b *testing.B) {
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "ledger.db"))
			if err != nil {
				b.Fatal(err)
			}
			eng := engine.New(st, engine.Options{DisableWorkers: true, Logger: logger})
			defer func() { eng.Close(); st.Close() }()
			srv := server.New(eng, server.Config{Logger: logger})
			ctx := context.Background()
			if _, err := srv.PublishPolicy(ctx, connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
				Subject: ledger.AnySubject, Route: "bench",
				Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1 << 40, RefillInterval: durationpb.New(time.Second)}},
				HoldTtl:    durationpb.New(time.Hour),
			}})); err != nil {
				b.Fatal(err)
			}
			cfg, err := envoyrls.ParseConfig([]byte("domains: [{name: bench, rules: [{subject: {key: tenant}, route: {value: bench}, unit: tokens}]}]"))
			if err != nil {
				b.Fatal(err)
			}
			svc := envoyrls.New(srv, cfg, logger)
			check := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "t1")}}
			var next atomic.Int64
			b.SetParallelism(32) // 64 goroutines on 2 Ps
			var before syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &before)
			b.ResetTimer()
			call := func() bool {
				if variant == "ShouldRateLimit" {
					if resp, err := svc.ShouldRateLimit(ctx, check); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						b.Error(resp, err)
						return false
					}
					return true
				}
				id := fmt.Sprintf("check-%d", next.Add(1))
				reserve, _, refused := srv.ReserveCommand(ctx, &v1.ReserveRequest{ReservationId: id, Subject: "t1", Route: "bench", Units: map[string]int64{"tokens": 1}})
				if refused != nil {
					b.Error(refused)
					return false
				}
				cmds := []ledger.Command{reserve}
				if variant != "reserve" {
					settle := ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: id, Units: reserve.Units}
					cmds = append(cmds, ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: id}, settle)
				}
				results, cerr := srv.Run(ctx, cmds)
				if cerr != nil {
					b.Error(cerr)
					return false
				}
				for _, r := range results {
					if r.Err != nil {
						b.Error(r.Err)
						return false
					}
				}
				return true
			}
			b.RunParallel(func(pb *testing.PB) {
				done := make(chan bool)
				for pb.Next() {
					if perCall == "" {
						if !call() {
							return
						}
						continue
					}
					go func() { done <- call() }()
					if !<-done {
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
