package main

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestContractBacklogOverdueList: with serve --resolver-config, backlog's
// overdueReservationIds is a list like the others of README's [] rule:
// [] when nothing is overdue (the API leaves it out, so `jq
// '.overdueReservationIds[]'` failed on the usual answer), and with
// --all it names the overdue reservations of every page, not only the
// last page's.
func TestContractBacklogOverdueList(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	resolver := writeFile(t, dir, "resolver.json", `{"routes":{"chat.generate":{"unknownDeadline":"1s"},"*":{"unknownDeadline":"1h"}}}`)
	srv := startServer(t, bin, filepath.Join(dir, "data"), "--resolver-config", resolver)
	cli := func(args ...string) string {
		t.Helper()
		return cliAgainst(t, bin, srv.url, args...)
	}
	backlog := func(args ...string) map[string]any {
		t.Helper()
		var got map[string]any
		out := cli(append([]string{"backlog"}, args...)...)
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("capledger backlog %v: %v\n%s", args, err, out)
		}
		return got
	}
	policy := func(route string) {
		cli("policy", "publish", writeFile(t, dir, route+".yaml", "subject: tenant-7\nroute: "+route+"\n"+
			"dimensions:\n  - unit: tokens\n    burst: 1000\n"))
	}
	policy("chat.generate")
	policy("embed")
	unknown := func(route, id string) {
		cli("reserve", "--subject", "tenant-7", "--route", route, "--units", "tokens=10", "--id", id)
		cli("start", id, "--operation", "op-"+id)
		cli("mark-unknown", id)
	}
	// Nothing overdue yet (1h): an empty list.
	unknown("embed", "e-1")
	for backlog()["resolverScanned"] != true {
		time.Sleep(50 * time.Millisecond)
	}
	if got, ok := backlog()["overdueReservationIds"].([]any); !ok || len(got) != 0 {
		t.Errorf("capledger backlog with nothing overdue: overdueReservationIds %v; want []", backlog()["overdueReservationIds"])
	}
	// Three overdue (1s), listed one per page.
	for _, id := range []string{"r-1", "r-2", "r-3"} {
		unknown("chat.generate", id)
	}
	for backlog()["overdue"] != "3" {
		time.Sleep(50 * time.Millisecond)
	}
	want := []any{"r-1", "r-2", "r-3"}
	if got := backlog()["overdueReservationIds"]; !reflect.DeepEqual(got, want) {
		t.Errorf("capledger backlog: overdueReservationIds %v; want %v", got, want)
	}
	all := backlog("--limit", "1", "--all")
	if got := all["overdueReservationIds"]; !reflect.DeepEqual(got, want) {
		t.Errorf("capledger backlog --limit 1 --all: overdueReservationIds %v; want %v (every page's)", got, want)
	}
	if n := len(all["reservations"].([]any)); n != 4 {
		t.Errorf("capledger backlog --limit 1 --all: %d reservations; want 4", n)
	}
}
