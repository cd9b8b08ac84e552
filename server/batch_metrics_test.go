package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
)

// capledger_batch_attempts is the attempts per batch (docs/API.md: above
// 1 when conflicts were retried), capledger_batch_commands the commands
// in it: one batch of 7 commands committed on its 2nd attempt shows 2
// attempts, not 7.
func TestBatchMetricsCountAttemptsAndCommandsApart(t *testing.T) {
	m := server.NewMetrics()
	m.ObserveBatch(engine.BatchInfo{Commands: 7, Attempts: 2, Duration: time.Millisecond})
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	body := string(raw)
	for _, want := range []string{
		"capledger_batch_attempts_sum 2\n",
		"capledger_batch_attempts_count 1\n",
		`capledger_batch_attempts_bucket{le="1"} 0` + "\n",
		`capledger_batch_attempts_bucket{le="2"} 1` + "\n",
		"capledger_batch_commands_sum 7\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grep(body, "capledger_batch"))
		}
	}
}
