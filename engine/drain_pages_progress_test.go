package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// A drain pass over a superseded generation whose accounts are drained
// already reads many pages within one Pager.Next (none yields a command),
// and tells a bounded caller after each page read (store.Progressed), so
// the server's --store-timeout bounds the wait for one page, not the
// whole scan (server/storecap.go): a healthy store answering every page
// in time never ends the pass.
func TestRunDrainsReportsEveryPageItReads(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := New(open(t), Options{DisableWorkers: true, PageSize: 2, Clock: func() time.Time { return t0 }})
			t.Cleanup(func() { e.Close() })
			publish := func(burst int64) {
				t.Helper()
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
					Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}}.WithDefaults()
				mustDo(t, e, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			const subjects = 12
			publish(1000)
			for i := range subjects {
				id := fmt.Sprintf("r-%d", i)
				mustDo(t, e, ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: fmt.Sprintf("t-%02d", i), Route: "chat.generate", Region: "eu", Units: ledger.Amounts{10}})
				mustDo(t, e, ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
			}
			publish(2000) // supersedes the first generation, with room for all it holds
			if _, err := e.RunDrains(ctx); err != nil {
				t.Fatal(err)
			}
			pages := 0
			counted := store.WithProgress(ctx, func() { pages++ })
			moved, err := e.RunDrains(counted)
			if err != nil || moved != 0 {
				t.Fatalf("second pass: %d moves, %v; want 0, nil", moved, err)
			}
			// 12 drained accounts in pages of 2: 6 pages at least.
			if pages < subjects/2 {
				t.Fatalf("the pass reported %d waits answered over %d accounts in pages of 2; want one per page read, at least %d", pages, subjects, subjects/2)
			}
		})
	}
}
