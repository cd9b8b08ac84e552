package postgres_test

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/replicatest"
)

// capledger_debt_accounts is right on every replica from its start, with
// no audit anywhere: two `capledger serve` replicas on one PostgreSQL
// store, 3 subjects put in debt through the first, and a third replica
// started after the debts (none ever audited); /metrics scraped over HTTP
// shows 3 on all of them, then 4 once the second puts a fourth subject in
// debt. It counts from the store's debt index at scrape (cached 5 s, so
// the test waits that long between figures).
func TestDebtAccountsMetricOnEveryReplicaWithoutAudit(t *testing.T) {
	dsn := replicatest.SchemaDSN(t)
	bin := replicatest.BuildCapledger(t)
	first := replicatest.StartReplica(t, bin, dsn)
	second := replicatest.StartReplica(t, bin, dsn)
	call := func(addr, method, body string) {
		t.Helper()
		resp, err := http.Post("http://"+addr+"/capledger.v1.LedgerService/"+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, body, resp.StatusCode, out)
		}
	}
	gauge := regexp.MustCompile(`(?m)^capledger_debt_accounts (\S+)$`)
	scrape := func(addr string) string {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		m := gauge.FindSubmatch(body)
		if m == nil {
			return "absent"
		}
		return string(m[1])
	}
	call(first.Addr, "PublishPolicy", `{"policy":{"subject":"*","route":"chat","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"3600s","maxOverdraft":"1000"}]}}`)
	for i := range 3 {
		id := fmt.Sprintf("r%d", i)
		call(first.Addr, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":"t%d","route":"chat","units":{"tokens":10}}`, id, i))
		call(first.Addr, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id))
		call(first.Addr, "Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":150}}`, id, id))
	}
	third := replicatest.StartReplica(t, bin, dsn) // started after the debts, never audited
	for _, r := range []*replicatest.Replica{first, second, third} {
		if got := scrape(r.Addr); got != "3" {
			t.Errorf("replica %s: capledger_debt_accounts %s, want 3", r.Addr, got)
		}
	}
	// A fourth debtor through the second replica: every replica counts it
	// once its scrape cache has expired.
	call(second.Addr, "Reserve", `{"reservationId":"r3","subject":"t3","route":"chat","units":{"tokens":10}}`)
	call(second.Addr, "Start", `{"reservationId":"r3","operationId":"op-r3"}`)
	call(second.Addr, "Settle", `{"reservationId":"r3","operationId":"op-r3","actualUnits":{"tokens":150}}`)
	time.Sleep(5100 * time.Millisecond) // past the scrape cache
	for _, r := range []*replicatest.Replica{first, second, third} {
		if got := scrape(r.Addr); got != "4" {
			t.Errorf("replica %s after a fourth debt: capledger_debt_accounts %s, want 4", r.Addr, got)
		}
	}
}
