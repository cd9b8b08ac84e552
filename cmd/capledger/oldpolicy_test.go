package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/sqlite"
)

// A policy published before epochLength had its 1s minimum and
// fairnessWeight its 2^20 maximum (both are refused at publish now) is
// stored as it was, here written straight into the store as the older
// server wrote it. A serve over that data starts and runs it as it is:
// it admits, starts and settles under it, closes its 500 ms epochs with
// statements, audits clean, shows its weight on the console's fairness
// page, rolls out and rolls back and drains its accounts; publishing its
// terms again is refused (INVALID_POLICY naming the bound, never a silent
// replay or a changed generation), as README's upgrade note says.
func TestPolicyStoredBeforeTheEpochAndWeightBoundsStillRuns(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, open.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	old := ledger.Policy{
		Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: ledger.DefaultRegion}, Generation: 1,
		Dimensions:     []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second}},
		HoldTTL:        30 * time.Second,
		EpochLength:    500 * time.Millisecond,
		FairnessWeight: 2 * ledger.MaxFairnessWeight,
		PublishedAt:    time.Now().Add(-time.Hour),
	}.WithDefaults()
	tx, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{
		Meta:     map[string]int64{ledger.MetaGeneration: 1},
		Policies: []ledger.Policy{old},
		Heads:    []ledger.PolicyHead{{Key: old.Key, Active: 1, Latest: 1}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	url := startInProcess(t, "--data-dir", dir)
	run := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := cli(t, url, args...)
		wantExit(t, want, code, out, errOut)
		return out + errOut
	}
	post := func(method, body string) map[string]any {
		t.Helper()
		resp, err := http.Post(url+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s %v %v", method, resp.Status, m, err)
		}
		return m
	}

	// Admit, start and settle, across several of its epochs.
	for i, id := range []string{"r1", "r2", "r3"} {
		if i > 0 {
			time.Sleep(600 * time.Millisecond) // past an epoch's end
		}
		run(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=100", "--id", id)
		run(exitOK, "start", "--id", id, "--operation", "op-"+id)
		run(exitOK, "settle", "--id", id, "--operation", "op-"+id, "--units", "tokens=40")
	}
	// The epoch worker closes the ended epochs; the statements chain.
	deadline := time.Now().Add(20 * time.Second)
	for {
		list := post("/capledger.v1.ConsoleService/ListStatements", `{"subject":"tenant-7","route":"chat.generate","policyGeneration":"1"}`)
		statements, _ := list["statements"].([]any)
		if len(statements) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the 500 ms epochs closed no statements: %v", list)
		}
		time.Sleep(100 * time.Millisecond)
	}
	run(exitOK, "audit", "--progress=false") // exit 6 on a discrepancy
	fair := post("/capledger.v1.ConsoleService/GetFairness", `{}`)
	if b, _ := json.Marshal(fair); !strings.Contains(string(b), `"weight":"2097152"`) {
		t.Errorf("the fairness page does not show the stored weight 2^21: %s", b)
	}

	// Publishing the stored terms again is refused by name, and changes
	// nothing: generation 1 stays the only one, active.
	got := run(exitOK, "policy", "get", "1", "--format", "yaml")
	path := filepath.Join(t.TempDir(), "old.yaml")
	if err := os.WriteFile(path, []byte(got), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := run(exitUsage, "policy", "publish", path); !strings.Contains(out, "INVALID_POLICY") || !strings.Contains(out, "minimum 1s") {
		t.Errorf("a republish of the stored terms:\n%s", out)
	}
	if list := post("/capledger.v1.LedgerService/ListPolicies", `{}`); len(list["policies"].([]any)) != 1 {
		t.Fatalf("the refused republish published: %v", list)
	}

	// Roll out over its route, then roll it back and drain it.
	run(exitOK, "rollout", "create", "old", "--routes", "chat.generate")
	run(exitOK, "rollout", "set", "old", "--percent", "100")
	run(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10", "--id", "r4")
	run(exitOK, "release", "--id", "r4")
	run(exitOK, "rollback", "1")
	if out := run(exitOK, "rollback", "--status", "1"); !regexpLine(out, `^1\s+\*/chat\.generate@global\s+rolled back\s`) {
		t.Errorf("drain progress of the old generation:\n%s", out)
	}
	run(exitNotFound, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10", "--id", "r5")
	run(exitOK, "audit", "--progress=false")
}
