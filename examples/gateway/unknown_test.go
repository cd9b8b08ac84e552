package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

// Unknown operation records a previous process left are logged at start
// until the ledger says their reservation ended; one an operator settled
// is removed and not logged at the next start.
func TestSettledUnknownOperationsAreNotLoggedAgain(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, engine.Options{Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.HTTPServer(server.New(eng, server.Config{Logger: quiet}).Handler(), quiet)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); eng.Close(); st.Close() })
	c, err := client.New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	policies := demoPolicies()
	for _, p := range policies {
		if _, _, err := c.PublishPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// Two operations were running when the gateway died.
	dir := filepath.Join(t.TempDir(), "ops")
	ops, err := client.OpenOperationStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{} // operation -> reservation
	for _, op := range []string{"op-settled", "op-open"} {
		rr, err := c.Reserve(ctx, client.ReserveRequest{Subject: policies[0].GetSubject(), Route: Route, Units: client.Units{"tokens": 10, "requests": 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Start(ctx, rr.ReservationID, op); err != nil {
			t.Fatal(err)
		}
		if err := ops.Put(ctx, client.OperationRecord{OperationID: op, ReservationID: rr.ReservationID, Status: client.OperationRunning}); err != nil {
			t.Fatal(err)
		}
		ids[op] = rr.ReservationID
	}
	var logs bytes.Buffer
	log.SetOutput(&logs)
	defer log.SetOutput(os.Stderr)
	restart := func() string {
		logs.Reset()
		ops, _, err := openOperations(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		logUnknown(ctx, c, ops)
		return logs.String()
	}
	if out := restart(); !strings.Contains(out, "op-settled") || !strings.Contains(out, "op-open") {
		t.Fatalf("first restart logs both unknown operations:\n%s", out)
	}
	// An operator settles one (OPERATIONS.md, "The USAGE_UNKNOWN resolver").
	if _, err := c.Settle(ctx, ids["op-settled"], "op-settled", client.Units{"tokens": 7, "requests": 1}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out := restart()
		if strings.Contains(out, "op-settled") && strings.Contains(out, "usage unknown") {
			t.Fatalf("a settled operation is logged as unknown again:\n%s", out)
		}
		if !strings.Contains(out, "operation op-open of reservation "+ids["op-open"]+": usage unknown") {
			t.Fatalf("the unresolved operation is no longer logged:\n%s", out)
		}
	}
	if _, ok, err := ops.Get(ctx, "op-settled"); ok || err != nil {
		t.Fatalf("the settled operation's record is still there: %v %v", ok, err)
	}
	if rec, ok, err := ops.Get(ctx, "op-open"); !ok || err != nil || rec.Status != client.OperationUnknown {
		t.Fatalf("the unresolved record: %+v %v %v", rec, ok, err)
	}
}
