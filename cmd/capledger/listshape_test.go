package main

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestContractCLIOutputShapes: README ("The capledger command"): a client
// command prints the API's JSON answer, with a list printed [] when empty
// rather than left out (protojson leaves an empty list out, so backlog
// printed {} and `jq '.reservations[]'` failed on it), the list first and
// every other field as the API answers it; get prints the reservation
// itself (the answer's "reservation"), as get --help says.
func TestContractCLIOutputShapes(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, filepath.Join(dir, "data"))
	cli := func(args ...string) string {
		t.Helper()
		return cliAgainst(t, bin, srv.url, args...)
	}
	api := func(method, body string) map[string]any {
		t.Helper()
		a := contractCall(t, srv.url, "POST", method, []byte(body), nil)
		if a.status != 200 {
			t.Fatalf("%s %s: %d %s", method, body, a.status, a.raw)
		}
		return a.body
	}
	// listed checks that out is the API's answer with the list field
	// first: [] when want has none, and every other field as want has it
	// (a field named in varies, a time of the call, only present).
	listed := func(args []string, field string, want map[string]any, varies ...string) {
		t.Helper()
		out := cli(args...)
		name := "capledger " + strings.Join(args, " ")
		keys, err := topKeys(out)
		if err != nil || len(keys) == 0 || keys[0] != field {
			t.Errorf("%s printed fields %q (%v); want %q first\n%s", name, keys, err, field, out)
			return
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		if _, ok := want[field]; !ok {
			if list, ok := got[field].([]any); !ok || len(list) != 0 {
				t.Errorf("%s: %q is %v; want [] for an empty list\n%s", name, field, got[field], out)
			}
			want[field] = []any{}
		}
		for _, key := range varies {
			if _, ok := got[key]; !ok || want[key] == nil {
				t.Errorf("%s: %q printed: %v, in the API's answer: %v", name, key, got[key], want[key])
			}
			delete(got, key)
			delete(want, key)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s printed\n%s\nwant the API's answer %v", name, out, want)
		}
	}

	// A fresh ledger: every list empty.
	listed([]string{"policy", "list"}, "policies", api("ListPolicies", `{}`))
	listed([]string{"backlog"}, "reservations", api("ListUsageUnknown", `{}`))
	listed([]string{"debts"}, "accounts", api("ListDebts", `{}`))
	listed([]string{"account", "--subject", "tenant-7", "--route", "chat.generate"}, "accounts",
		api("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`))
	listed([]string{"audit"}, "discrepancies", api("Audit", `{}`), "checkedAt")
	listed([]string{"shard", "list", "--json"}, "shards", api("ShardService/ListShards", `{}`))
	listed([]string{"rollout", "report", "--json"}, "comparisons", api("RolloutService/ShadowReport", `{}`), "since")

	// One reservation in the USAGE_UNKNOWN backlog.
	cli("policy", "publish", writeFile(t, dir, "p.yaml", "subject: tenant-7\nroute: chat.generate\nholdTtl: 60s\n"+
		"dimensions:\n  - unit: tokens\n    burst: 1000\n"))
	reserved := cli("reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10", "--id", "r-1")
	cli("start", "r-1", "--operation", "op-1")
	cli("mark-unknown", "r-1")

	// Lists that are not empty print as the API answers; an empty page of
	// a backlog that is not keeps the store-wide figures after its [].
	listed([]string{"policy", "list"}, "policies", api("ListPolicies", `{}`))
	listed([]string{"policy", "list", "--subject", "tenant-8"}, "policies", api("ListPolicies", `{"subject":"tenant-8"}`))
	listed([]string{"backlog"}, "reservations", api("ListUsageUnknown", `{}`))
	backlog := api("ListUsageUnknown", `{"subject":"tenant-8"}`)
	if backlog["backlog"] != "1" || backlog["oldestUsageUnknownAt"] == nil {
		t.Fatalf("ListUsageUnknown of another subject: %v; want the store-wide backlog of 1", backlog)
	}
	listed([]string{"backlog", "--subject", "tenant-8"}, "reservations", backlog)
	listed([]string{"account", "--subject", "tenant-7", "--route", "chat.generate"}, "accounts",
		api("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`))

	// get prints the reservation itself; reserve (start, settle ...)
	// print the answer, the reservation under "reservation".
	var got, receipt map[string]any
	if err := json.Unmarshal([]byte(cli("get", "r-1")), &got); err != nil {
		t.Fatal(err)
	}
	if want := api("GetReservation", `{"reservationId":"r-1"}`)["reservation"]; !reflect.DeepEqual(got, want) {
		t.Errorf("capledger get r-1 printed %v; want the API answer's reservation %v", got, want)
	}
	if err := json.Unmarshal([]byte(reserved), &receipt); err != nil {
		t.Fatal(err)
	}
	if r, _ := receipt["reservation"].(map[string]any); r["reservationId"] != "r-1" || got["reservationId"] != "r-1" || got["state"] != "RESERVATION_STATE_USAGE_UNKNOWN" {
		t.Errorf("capledger reserve printed %v and get %v; want .reservation.reservationId and .reservationId r-1", receipt, got)
	}
}

// topKeys returns the names of the top-level fields of the JSON object
// raw, in the order they are written.
func topKeys(raw string) ([]string, error) {
	dec := json.NewDecoder(strings.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.Join(errors.New("not an object"), err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
	}
	return keys, nil
}
