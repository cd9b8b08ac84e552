package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/sqlite"
)

// serve --statement-retention reaches the retention pass: over a data
// directory whose account closed hourly epochs four days ago, the pass
// removes those statements, /statusz counts them, ListStatements answers
// the one closed since (no error), and the audit stays clean. Without the
// flag nothing is removed.
func TestServeStatementRetention(t *testing.T) {
	for _, keep := range []string{"48h", ""} {
		t.Run("keep="+keep, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			st, err := sqlite.Open(ctx, filepath.Join(dir, open.DefaultFile))
			if err != nil {
				t.Fatal(err)
			}
			then := time.Now().Add(-96 * time.Hour)
			e := engine.New(st, engine.Options{Clock: func() time.Time { return then }, DisableWorkers: true})
			p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-1", Route: "chat", Region: ledger.DefaultRegion},
				Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}, EpochLength: time.Hour}.WithDefaults()
			if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
				t.Fatalf("publish: %+v %v", res, err)
			}
			for i := range 3 { // closes [then, +1h) and [+1h, +2h), in hours
				id := fmt.Sprintf("old-%d", i)
				if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: "tenant-1", Route: "chat", Region: ledger.DefaultRegion, Units: ledger.Amounts{10}}); err != nil || res.Err != nil {
					t.Fatalf("reserve %s: %+v %v", id, res, err)
				}
				then = then.Add(time.Hour)
			}
			e.Close()
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			flags := []string{"--data-dir", dir, "--retention-interval", "50ms", "--compaction", "0"}
			if keep != "" {
				flags = append(flags, "--statement-retention", keep)
			}
			url := startInProcess(t, flags...)
			// Closes the epoch of the last old reserve, ended this hour.
			mustPost(t, url, "Reserve", `{"reservationId":"now","subject":"tenant-1","route":"chat","units":{"tokens":10}}`)
			want := int64(2)
			if keep == "" {
				want = 0
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				st := statusz(t, url)
				if got := counter(st, "retention", "statementsRemoved"); got == want && counter(st, "retention", "passes") > 0 {
					break
				} else if got > want || time.Now().After(deadline) {
					t.Fatalf("/statusz retention: %v, want statementsRemoved %d", st["retention"], want)
				}
				time.Sleep(50 * time.Millisecond)
			}
			list := mustPost(t, url, "ConsoleService/ListStatements", `{"subject":"tenant-1","route":"chat","policyGeneration":"1"}`)
			if sts, _ := list["statements"].([]any); len(sts) != 3-int(want) {
				t.Fatalf("ListStatements: %v, want %d statements", list, 3-want)
			}
			audit := mustPost(t, url, "Audit", `{}`)
			if d, _ := audit["discrepancies"].([]any); len(d) > 0 {
				t.Fatalf("audit: %v", audit)
			}
		})
	}
}
