package server_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkReserveJSON measures Reserve over real HTTP/1.1 + JSON (the
// Connect protocol, as curl or any gateway sends it) into a SQLite file,
// with 8 concurrent clients per GOMAXPROCS: the HTTP, JSON and group-commit
// path end to end, fsync included.
//
//	go test -run '^$' -bench ReserveJSON -benchtime 5000x ./server
func BenchmarkReserveJSON(b *testing.B) {
	h := newHarness(b, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"bench","dimensions":[{"unit":"tokens","burst":"1000000000000"}]}}`, "")
	transport := &http.Transport{MaxIdleConnsPerHost: 512}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := next.Add(1)
			body := fmt.Sprintf(`{"reservationId":"bench-%d","subject":"tenant-%d","route":"bench","units":{"tokens":1}}`, n, n%64)
			resp, err := client.Post(h.url+"/capledger.v1.LedgerService/Reserve", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reserves/s")
	stats := h.engine.Stats()
	if stats.Batches > 0 {
		b.ReportMetric(float64(stats.Commands)/float64(stats.Batches), "cmds/batch")
	}
}
