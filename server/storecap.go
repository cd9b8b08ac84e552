package server

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/store"
)

// This file bounds how long a call waits for the store. A call without a
// deadline of its own waited for as long as the store took: against a
// hung PostgreSQL (packets dropped, or the server stopped), forever on
// every read, and on a write queued behind a stuck batch, or one whose
// pre-read (the reservation a Settle maps its usage by) hung. The engine
// bounds each commit (engine.Options.BatchTimeout); the server bounds
// every unary call's context by Config.StoreTimeout, and answers a call
// whose store did not answer in time 503 unavailable, as the store's
// other failures, never 504: the deadline was the server's, not the
// caller's.

// DefaultStoreTimeout is Config.StoreTimeout's default: the engine's
// default batch timeout, so a read waits for the store as long as a
// commit does.
const DefaultStoreTimeout = 10 * time.Second

// storeTimedOut is the cause of a call's context ended by StoreTimeout.
type storeTimedOut struct{ after time.Duration }

func (e storeTimedOut) Error() string {
	return fmt.Sprintf("the store did not answer within %s (serve --store-timeout)", e.after)
}

// uncappedProcedures are the unary calls whose work may take longer than
// the store timeout on a large ledger, so that they are capped per read
// instead (scanBound): a full audit reads the whole journal (its reads
// end when the store has not answered one for the store timeout, its own
// work between them uncounted), DrainProgress may run drain passes
// (runDrains: a page at a time, each commit bounded by the engine's batch
// timeout), and the console's ranking, its fairness page and
// DrainProgress scan every account (seconds to tens of seconds at a
// million, docs/OPERATIONS.md, On call): their scans end when the store
// has not answered a page for the store timeout, and the handlers cap
// their other reads themselves (capStore with an empty procedure).
var uncappedProcedures = map[string]bool{
	capledgerv1connect.LedgerServiceAuditProcedure:                 true,
	capledgerv1connect.ConsoleServiceListAccountStandingsProcedure: true,
	capledgerv1connect.ConsoleServiceGetFairnessProcedure:          true,
	capledgerv1connect.RolloutServiceDrainProgressProcedure:        true,
}

// capStore returns ctx bounded by the server's StoreTimeout for a call
// of procedure (ctx itself for an uncapped one), and its cancel.
func (s *Server) capStore(ctx context.Context, procedure string) (context.Context, context.CancelFunc) {
	if s.storeTimeout <= 0 || uncappedProcedures[procedure] {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, s.storeTimeout, storeTimedOut{s.storeTimeout})
}

// storeCapError returns the error a call answers with when the handler
// failed with err, ctx being the caller's context. A deadline_exceeded
// (or canceled) answer while the caller's own context is live was not
// the caller's deadline: it was the server's, the store timeout (this
// cap, a handler's own cap of its reads, or the engine's batch timeout,
// which serve sets to the same --store-timeout). It becomes 503
// unavailable with the same message and details (which say "not
// applied" or "outcome unknown" for a command), followed, for a
// deadline, by what ran out, and for a read (read) by that nothing was
// changed. Any other error is returned as it is.
func (s *Server) storeCapError(ctx context.Context, err error, read bool) error {
	var cerr *connect.Error
	if err == nil || ctx.Err() != nil || !errors.As(err, &cerr) {
		return err
	}
	if cerr.Code() != connect.CodeDeadlineExceeded && cerr.Code() != connect.CodeCanceled {
		return err
	}
	msg := cerr.Message()
	if cerr.Code() == connect.CodeDeadlineExceeded {
		msg += "; " + storeTimedOut{s.storeTimeout}.Error()
	}
	if read {
		msg += "; nothing was changed (a read), retry"
	}
	out := connect.NewError(connect.CodeUnavailable, errors.New(msg))
	for _, d := range cerr.Details() {
		out.AddDetail(d)
	}
	for k, v := range cerr.Meta() {
		out.Meta()[k] = v
	}
	return out
}

// storeCap is the connect interceptor that bounds every unary call by
// capStore and maps its failures by storeCapError. Streams (StreamAudit)
// are left alone, as Audit is.
type storeCap struct{ s *Server }

func (c storeCap) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		capped, cancel := c.s.capStore(ctx, req.Spec().Procedure)
		defer cancel()
		resp, err := next(capped, req)
		return resp, c.s.storeCapError(ctx, err, readOnly(req))
	}
}

// readOnly reports whether req changes nothing: a method without side
// effects, or a DrainProgress that runs no drain pass.
func readOnly(req connect.AnyRequest) bool {
	if drain, ok := req.Any().(*v1.DrainProgressRequest); ok {
		return !drain.GetRunDrains()
	}
	return req.Spec().IdempotencyLevel == connect.IdempotencyNoSideEffects
}

func (c storeCap) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (c storeCap) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// scanBound returns ctx for a reader of many pages or rows, ended (its
// cause storeTimedOut) once it has waited limit for one answer of its
// store. A wait begins when the bound does, at each page the reader read
// (store.Progressed: it asks for the next at once) and whenever it asks
// again (store.Waits with true), and ends when the store answered
// (store.Waits with false: the reader's own work on an answer, an
// audit's checks or its pacing, is not the store's wait). The reader may
// take as long as it needs while its store answers, and ends within
// limit (and a tick, limit/8) of the store's last answer when it hangs.
// The CancelFunc releases it.
func scanBound(ctx context.Context, limit time.Duration) (context.Context, context.CancelFunc) {
	bounded, cancel := context.WithCancelCause(ctx)
	start := time.Now()
	since := func() int64 { return int64(time.Since(start)) + 1 }
	// asked is when the current wait began (since), 0 while the reader
	// works on an answer.
	var asked atomic.Int64
	asked.Store(since())
	go func() { // ends with bounded (the CancelFunc ends it)
		tick := time.NewTicker(max(limit/8, time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-bounded.Done():
				return
			case <-tick.C:
				if at := asked.Load(); at != 0 && since()-at >= int64(limit) {
					cancel(storeTimedOut{limit})
					return
				}
			}
		}
	}()
	out := store.WithProgress(bounded, func() { asked.Store(since()) })
	out = store.WithWaits(out, func(asking bool) {
		if asking {
			asked.Store(since())
		} else {
			asked.Store(0)
		}
	})
	return out, func() { cancel(context.Canceled) }
}

// scanTimedOut returns the answer of a scan that scanBound ended (its
// store failed with the context's cancellation): 503 unavailable
// STORE_UNAVAILABLE saying what ran out and that nothing was changed;
// any other failure (or nil) as it is.
func scanTimedOut(ctx context.Context, cerr *connect.Error) *connect.Error {
	var timedOut storeTimedOut
	if cerr == nil || !errors.As(context.Cause(ctx), &timedOut) {
		return cerr
	}
	return withReason(connect.NewError(connect.CodeUnavailable,
		fmt.Errorf("%s; %w; nothing was changed (a read), retry", cerr.Message(), timedOut)), ReasonStoreUnavailable)
}
