package client

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/api/opstatus"
)

func TestOperationStoreSurvivesRestartsAndResolvesOrphans(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "ops")
	s, err := OpenOperationStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	put := func(s OperationStore, op, status string, units Units) error {
		return s.Put(ctx, OperationRecord{OperationID: op, ReservationID: "rsv-" + op, Status: status, ActualUnits: units})
	}
	for _, r := range []struct {
		op, status string
		units      Units
	}{{"op-bound", OperationStarting, nil}, {"op-run", OperationRunning, nil}, {"op-done", OperationFinished, Units{"tokens": 7}}} {
		if err := put(s, r.op, r.status, r.units); err != nil {
			t.Fatal(err)
		}
	}
	if err := put(s, "op-done", OperationRunning, nil); !errors.Is(err, ErrOperationFinal) {
		t.Fatalf("finished record changed: %v", err)
	}
	if err := put(s, "op-done", OperationFinished, Units{"tokens": 8}); !errors.Is(err, ErrOperationFinal) {
		t.Fatalf("finished record got other units: %v", err)
	}
	if err := put(s, "op-done", OperationFinished, Units{"tokens": 7}); err != nil {
		t.Fatalf("the same finished record again: %v", err)
	}
	// A write a crash interrupted leaves a temporary file behind.
	if err := os.WriteFile(filepath.Join(dir, ".tmp-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A new process opens the directory.
	s2, err := OpenOperationStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"op-bound": OperationNeverStarted, "op-run": OperationUnknown, "op-done": OperationFinished}
	for op, status := range want {
		rec, ok, err := s2.Get(ctx, op)
		if err != nil || !ok || rec.Status != status || rec.ReservationID != "rsv-"+op {
			t.Fatalf("%s after restart: %+v %v %v, want %s", op, rec, ok, err, status)
		}
	}
	if rec, _, _ := s2.Get(ctx, "op-done"); rec.ActualUnits["tokens"] != 7 {
		t.Fatalf("finished units lost: %+v", rec)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-123")); !os.IsNotExist(err) {
		t.Fatalf("temporary file kept: %v", err)
	}
	unknown, err := s2.Unknown()
	if err != nil || len(unknown) != 1 || unknown[0].OperationID != "op-run" {
		t.Fatalf("unknown records: %+v %v", unknown, err)
	}
	// The gateway learns the usage elsewhere; unknown may still finish,
	// never started may not.
	if err := Finish(ctx, s2, "rsv-op-run", "op-run", Units{"tokens": 3}); err != nil {
		t.Fatal(err)
	}
	if err := Finish(ctx, s2, "rsv-op-bound", "op-bound", Units{"tokens": 3}); !errors.Is(err, ErrOperationFinal) {
		t.Fatalf("never-started record finished: %v", err)
	}
	if err := s2.Put(ctx, OperationRecord{OperationID: "op-run", ReservationID: "rsv-other", Status: OperationFinished}); err == nil {
		t.Fatal("an operation moved to another reservation")
	}
}

func TestRunRecordsOperationsAndTheHandlerAnswersFromThem(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c, ops := clientWithOperations(t, l)
	secret := []byte("a-shared-secret-of-the-route")
	srv := httptest.NewServer(OperationStatusHandler(ops, secret))
	defer srv.Close()
	status := &opstatus.Client{Base: srv.URL, Secret: secret}
	req := ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 600, "requests": 1}, EstimatorDigest: "sha256:e57"}

	res, err := c.Run(ctx, req, func(ctx context.Context) (Units, error) {
		receipt, _ := ReceiptFrom(ctx)
		got, err := status.Get(ctx, receipt.ReservationID, receipt.OperationID)
		if err != nil || got.Status != opstatus.StatusRunning {
			t.Errorf("while the work runs the endpoint answers %+v %v, want running", got, err)
		}
		return Units{"tokens": 250, "requests": 1}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := status.Get(ctx, res.Receipt.ReservationID, res.Receipt.OperationID)
	if err != nil || got.Status != opstatus.StatusFinished || got.Units["tokens"] != 250 || got.Units["requests"] != 1 {
		t.Fatalf("after Run: %+v %v, want finished with 250 tokens", got, err)
	}
	// Signed by someone else, or asked for another reservation.
	if _, err := (&opstatus.Client{Base: srv.URL, Secret: []byte("not-the-route-secret")}).Get(ctx, res.Receipt.ReservationID, res.Receipt.OperationID); err == nil {
		t.Fatal("answered a request signed with another secret")
	}
	if got, err := status.Get(ctx, "rsv-other", res.Receipt.OperationID); err != nil || got.Status != opstatus.StatusUnknown {
		t.Fatalf("another reservation's question: %+v %v, want unknown (404)", got, err)
	}

	// Work whose usage is unknown is recorded unknown, never finished.
	_, err = c.Run(ctx, req, func(ctx context.Context) (Units, error) { return nil, context.DeadlineExceeded })
	var unknown *UsageUnknownError
	if !errors.As(err, &unknown) {
		t.Fatalf("run with a timed-out work: %v", err)
	}
	got, err = status.Get(ctx, unknown.Receipt.ReservationID, unknown.Receipt.OperationID)
	if err != nil || got.Status != opstatus.StatusUnknown {
		t.Fatalf("unknown work: %+v %v, want unknown", got, err)
	}
	l.audit(t)
}

// Prune removes old final records only: work that is starting, running or
// unknown stays answerable, and so does a final record newer than the
// horizon.
func TestOperationStorePruneRemovesOnlyOldFinalRecords(t *testing.T) {
	ctx := context.Background()
	s, err := OpenOperationStore(filepath.Join(t.TempDir(), "ops"))
	if err != nil {
		t.Fatal(err)
	}
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recent := old.Add(48 * time.Hour)
	for _, r := range []OperationRecord{
		{OperationID: "op-old-done", Status: OperationFinished, ActualUnits: Units{"tokens": 3}, UpdatedAt: old},
		{OperationID: "op-old-never", Status: OperationNeverStarted, UpdatedAt: old},
		{OperationID: "op-old-running", Status: OperationRunning, UpdatedAt: old},
		{OperationID: "op-old-unknown", Status: OperationUnknown, UpdatedAt: old},
		{OperationID: "op-old-starting", Status: OperationStarting, UpdatedAt: old},
		{OperationID: "op-recent-done", Status: OperationFinished, ActualUnits: Units{"tokens": 4}, UpdatedAt: recent},
	} {
		r.ReservationID = "rsv-" + r.OperationID
		if err := s.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := s.Prune(old.Add(24 * time.Hour))
	if err != nil || removed != 2 {
		t.Fatalf("Prune: removed %d, %v; want the 2 old final records", removed, err)
	}
	for op, want := range map[string]bool{"op-old-done": false, "op-old-never": false, "op-old-running": true,
		"op-old-unknown": true, "op-old-starting": true, "op-recent-done": true} {
		if _, ok, err := s.Get(ctx, op); err != nil || ok != want {
			t.Errorf("%s after Prune: present %v (%v), want %v", op, ok, err, want)
		}
	}
}

// Work that reports a usage the ledger will refuse (a negative amount, a
// unit the reservation does not have) is recorded unknown, which is what
// Run makes of it, never finished with the refused figures: a finished
// record is final, so the resolver would keep answering figures the
// ledger cannot take and the reservation would stay USAGE_UNKNOWN.
func TestRunRecordsRefusedUsageAsUnknown(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c, ops := clientWithOperations(t, l)
	for name, usage := range map[string]Units{"negative": {"tokens": -5}, "unknown unit": {"tokenz": 5}} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
				func(context.Context) (Units, error) { return usage, nil })
			unknown := mustErrAs[*UsageUnknownError](t, err)
			rec, ok, gerr := ops.Get(ctx, unknown.Receipt.OperationID)
			if gerr != nil || !ok || rec.Status != OperationUnknown || rec.ActualUnits != nil {
				t.Fatalf("record %+v %v %v, want unknown without units", rec, ok, gerr)
			}
			// Not final: the gateway can still record the real usage.
			if err := Finish(ctx, ops, unknown.Receipt.ReservationID, unknown.Receipt.OperationID, Units{"tokens": 7}); err != nil {
				t.Fatalf("finish after the refusal: %v", err)
			}
		})
	}
}

// clientWithOperations returns a client of l recording its operations in
// a store of its own, closed when the test ends.
func clientWithOperations(t *testing.T, l *testLedger) (*Client, *FileOperationStore) {
	t.Helper()
	ops, err := OpenOperationStore(filepath.Join(t.TempDir(), "ops"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(l.addr, noBreakerWatchdog, WithOperationStore(ops))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ops
}
