package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/client"
)

// benchProtocols are the ways a gateway reaches the server: the Connect
// protocol with binary protobuf or JSON over keep-alive HTTP/1.1, and gRPC
// over cleartext HTTP/2 (h2c, prior knowledge).
var benchProtocols = []struct {
	name     string
	protocol client.Protocol
}{
	{name: "connect-proto", protocol: client.ProtocolConnect},
	{name: "connect-json", protocol: client.ProtocolConnectJSON},
	{name: "grpc-h2c", protocol: client.ProtocolGRPC},
}

// benchClient returns a LedgerService client for url over the Go SDK's own
// transport (keep-alive, no compression, enough idle connections for every
// caller, a request's headers and body in one write), as a gateway gets
// it. It is the SDK's raw client: no retries, no ids or digests minted, so
// the figures are those of the wire and the server.
func benchClient(b *testing.B, url string, protocol client.Protocol) capledgerv1connect.LedgerServiceClient {
	c, err := client.New(url, client.WithProtocol(protocol), client.WithMaxIdleConns(512), client.WithTimeout(30*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c.Raw()
}

// BenchmarkServeReserveParallel measures single Reserve calls end to end:
// connect-go clients over a real 127.0.0.1 listener, the server's
// handlers, the engine's group commit and a SQLite file fsynced on every
// commit. The clients run in the same process, so the figures are what two
// cores do for client and server together.
//
//	go test -run '^$' -bench ServeReserveParallel -benchtime 20000x ./server
func BenchmarkServeReserveParallel(b *testing.B) {
	for _, proto := range benchProtocols {
		for _, callers := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", proto.name, callers), func(b *testing.B) {
				h := newHarness(b, harnessOptions{})
				h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"bench","holdTtl":"3600s","dimensions":[{"unit":"tokens","burst":"1000000000000000"}]}}`, "")
				c := benchClient(b, h.url, proto.protocol)
				var next atomic.Int64
				latencies := make([]time.Duration, b.N+callers)
				b.SetParallelism((callers + 1) / 2)
				cpu := cpuTime()
				b.ResetTimer()
				caller := func(more func() bool) {
					req := &v1.ReserveRequest{Subject: "tenant-7", Route: "bench", Units: map[string]int64{"tokens": 1}}
					for more() {
						n := next.Add(1)
						req.ReservationId = fmt.Sprintf("rl-bench-%012d", n)
						start := time.Now()
						if _, err := c.Reserve(context.Background(), connect.NewRequest(req)); err != nil {
							b.Error(err)
							return
						}
						latencies[n-1] = time.Since(start)
					}
				}
				if callers == 1 {
					n := 0
					caller(func() bool { n++; return n <= b.N })
				} else {
					b.RunParallel(func(pb *testing.PB) { caller(pb.Next) })
				}
				b.StopTimer()
				reportLatency(b, latencies[:next.Load()], 1, cpuTime()-cpu)
				if s := h.engine.Stats(); s.Batches > 0 {
					b.ReportMetric(float64(s.Commands)/float64(s.Batches), "cmds/batch")
				}
			})
		}
	}
}

// BenchmarkServeReserveBatch measures ReserveBatch calls of 100
// reservations from 4 concurrent callers, end to end as above.
//
//	go test -run '^$' -bench ServeReserveBatch -benchtime 500x ./server
func BenchmarkServeReserveBatch(b *testing.B) {
	const size, callers = 100, 4
	for _, proto := range benchProtocols {
		b.Run(proto.name, func(b *testing.B) {
			h := newHarness(b, harnessOptions{})
			h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"bench","holdTtl":"3600s","dimensions":[{"unit":"tokens","burst":"1000000000000000"}]}}`, "")
			c := benchClient(b, h.url, proto.protocol)
			var next atomic.Int64
			latencies := make([]time.Duration, b.N+callers)
			b.SetParallelism((callers + 1) / 2)
			cpu := cpuTime()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := &v1.ReserveBatchRequest{Requests: make([]*v1.ReserveRequest, size)}
				for i := range req.Requests {
					req.Requests[i] = &v1.ReserveRequest{Subject: "tenant-7", Route: "bench", Units: map[string]int64{"tokens": 1}}
				}
				for pb.Next() {
					n := next.Add(1)
					for i, r := range req.Requests {
						r.ReservationId = fmt.Sprintf("rl-bench-%012d-%03d", n, i)
					}
					start := time.Now()
					resp, err := c.ReserveBatch(context.Background(), connect.NewRequest(req))
					if err != nil {
						b.Error(err)
						return
					}
					for _, out := range resp.Msg.GetOutcomes() {
						if out.GetError() != nil {
							b.Errorf("outcome: %v", out.GetError())
							return
						}
					}
					latencies[n-1] = time.Since(start)
				}
			})
			b.StopTimer()
			reportLatency(b, latencies[:next.Load()], size, cpuTime()-cpu)
		})
	}
}

// cpuTime returns the CPU time (user and system) the process has used: on
// a machine shared with other work, CPU per call is the figure that does
// not depend on what else runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportLatency reports calls/s (and reservations/s when each call carries
// several), p50 and p99 of the calls measured, and the process's CPU time
// per call (client and server together).
func reportLatency(b *testing.B, latencies []time.Duration, perCall int, cpu time.Duration) {
	b.Helper()
	if len(latencies) == 0 {
		return
	}
	sorted := append([]time.Duration(nil), latencies...)
	slices.Sort(sorted)
	elapsed := b.Elapsed().Seconds()
	b.ReportMetric(float64(len(latencies))/elapsed, "calls/s")
	if perCall > 1 {
		b.ReportMetric(float64(len(latencies)*perCall)/elapsed, "reservations/s")
	}
	b.ReportMetric(float64(sorted[len(sorted)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(sorted[len(sorted)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(latencies)*perCall), "cpu-µs/op")
	b.ReportMetric(0, "ns/op") // wall time per call says nothing with concurrent callers
}
