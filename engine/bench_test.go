package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

// benchEngine returns an engine over a fresh SQLite file (WAL,
// synchronous=FULL: every batch is fsynced) with a policy whose burst no
// benchmark exhausts.
func benchEngine(b *testing.B) *Engine {
	b.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "capledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	e := New(st, Options{DisableWorkers: true})
	b.Cleanup(func() { e.Close(); st.Close() })
	p := ledger.Policy{
		Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1, RefillInterval: time.Hour}},
		HoldTTL:    time.Hour,
	}.WithDefaults()
	res, err := e.Do(context.Background(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	if err != nil || res.Err != nil {
		b.Fatalf("publish: %v %v", err, res.Err)
	}
	return e
}

var benchSeq atomic.Int64

func benchReserve() ledger.Command {
	id := fmt.Sprintf("rl-bench-%012d", benchSeq.Add(1))
	return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
		Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{1}}
}

// BenchmarkEngineReserve measures durable reserves through the engine over
// SQLite, without HTTP: callers=1 is the latency of one group commit of
// one command (fsync included); callers=64 is what group commit makes of
// 64 concurrent callers; batch=100 is DoBatch of 100 reserves.
//
//	go test -run '^$' -bench EngineReserve -benchtime 3s ./engine
func BenchmarkEngineReserve(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			e := benchEngine(b)
			b.SetParallelism((callers + 1) / 2)
			cpu := cpuTime()
			b.ResetTimer()
			reserve := func() bool {
				res, err := e.Do(context.Background(), benchReserve())
				if err != nil || res.Err != nil {
					b.Errorf("reserve: %v %v", err, res.Err)
					return false
				}
				return true
			}
			if callers == 1 {
				for n := 0; n < b.N && reserve(); n++ {
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() && reserve() {
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reserves/s")
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			if s := e.Stats(); s.Batches > 0 {
				b.ReportMetric(float64(s.Commands)/float64(s.Batches), "cmds/batch")
			}
		})
	}
	b.Run("batch=100", func(b *testing.B) {
		e := benchEngine(b)
		cpu := cpuTime()
		b.ResetTimer()
		cmds := make([]ledger.Command, 100)
		for n := 0; n < b.N; n++ {
			for i := range cmds {
				cmds[i] = benchReserve()
			}
			results, err := e.DoBatch(context.Background(), cmds)
			if err != nil {
				b.Fatal(err)
			}
			for i := range results {
				if results[i].Err != nil {
					b.Fatal(results[i].Err)
				}
			}
		}
		b.ReportMetric(float64(b.N*len(cmds))/b.Elapsed().Seconds(), "reserves/s")
		b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N*len(cmds)), "cpu-µs/reserve")
	})
}

// cpuTime returns the CPU time (user and system) the process has used: on
// a machine shared with other work, CPU per reserve is the figure that does
// not depend on what else runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
