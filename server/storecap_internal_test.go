package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/store"
)

// A shared scan (the console's ranking, its fairness page, DrainProgress)
// may take longer than the store timeout while its store answers each
// page: each page read (store.Progressed) gives it the timeout again. One
// whose store stops answering ends within the timeout of its last page,
// 503 unavailable STORE_UNAVAILABLE saying what ran out and that nothing
// was changed.
func TestSharedScanIsBoundedByItsPagesNotItsLength(t *testing.T) {
	const limit = time.Second
	shared := &sharedAnswers[int, int]{limit: limit}
	pages := 0
	value, cerr := shared.answer(context.Background(), 1, time.Time{}, func(ctx context.Context, v *int) *connect.Error {
		// Five pages of 300ms each: 1.5s in all, longer than the limit.
		for range 5 {
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return readError("accounts", ReasonAccountNotFound, ctx.Err())
			}
			pages++
			store.Progressed(ctx)
		}
		*v = pages
		return nil
	})
	if cerr != nil || *value != 5 {
		t.Fatalf("a scan of five pages, each answered within the limit: %v after %d pages", cerr, pages)
	}

	_, cerr = shared.answer(context.Background(), 2, time.Time{}, func(ctx context.Context, v *int) *connect.Error {
		store.Progressed(ctx) // one page, then a store that never answers
		<-ctx.Done()
		return readError("accounts", ReasonAccountNotFound, ctx.Err())
	})
	if cerr == nil || cerr.Code() != connect.CodeUnavailable || !strings.Contains(cerr.Message(), "did not answer within 1s (serve --store-timeout)") ||
		!strings.Contains(cerr.Message(), "nothing was changed") {
		t.Fatalf("a scan whose store stopped answering: %v, want unavailable saying the store did not answer within 1s and nothing was changed", cerr)
	}
	var reason string
	for _, d := range cerr.Details() {
		if msg, err := d.Value(); err == nil {
			if detail, ok := msg.(*v1.ErrorDetail); ok {
				reason = detail.GetReason()
			}
		}
	}
	if reason != ReasonStoreUnavailable {
		t.Fatalf("a scan whose store stopped answering: reason %q, want %s", reason, ReasonStoreUnavailable)
	}
}

// TestAuditWorkBetweenReadsIsNotTheStoresWait: scanBound, which bounds
// Audit, StreamAudit and drain passes, counts only the time a reader
// waits for its store (store.Waits true until false): a reader that
// works longer than the limit on each answer is not ended (an audit's
// checks and pacing on a large ledger), and one whose store leaves a
// read unanswered for the limit is, with the store timeout as cause.
func TestAuditWorkBetweenReadsIsNotTheStoresWait(t *testing.T) {
	const limit = 500 * time.Millisecond
	ctx, cancel := scanBound(context.Background(), limit)
	defer cancel()
	waiting := store.Waits(ctx)
	for range 3 {
		waiting(true) // a read the store answers at once
		waiting(false)
		time.Sleep(2 * limit) // the reader's own work on the answer
		if ctx.Err() != nil {
			t.Fatalf("a reader working %v on an answer was ended: %v", 2*limit, context.Cause(ctx))
		}
	}
	waiting(true) // a read the store never answers
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("a read left unanswered for a minute did not end the reader")
	}
	var timedOut storeTimedOut
	if !errors.As(context.Cause(ctx), &timedOut) {
		t.Fatalf("a read left unanswered ended the reader with %v, want the store timeout", context.Cause(ctx))
	}
}
