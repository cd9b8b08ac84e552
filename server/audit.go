package server

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
)

// auditor is the Ledger capability AuditService needs (engine.Engine has
// it): an audit in a mode, with progress.
type auditor interface {
	AuditWith(ctx context.Context, o engine.AuditOptions) ([]ledger.Discrepancy, error)
}

// auditProgressEvery is how often StreamAudit sends progress.
const auditProgressEvery = time.Second

// auditService implements AuditService.
type auditService struct{ s *Server }

func registerAuditService(mux *http.ServeMux, s *Server, options []connect.HandlerOption) {
	path, handler := capledgerv1connect.NewAuditServiceHandler(&auditService{s}, options...)
	mountProcedures(mux, path, handler, v1.File_capledger_v1_audit_proto.Services().ByName("AuditService"))
}

// StreamAudit implements AuditService.StreamAudit: the audit runs in this
// call's goroutine, a progress event goes out every auditProgressEvery
// (the latest figures again while a phase of the audit reports none, so a
// client waiting for the next message never takes a long phase for a dead
// server), and the result is the last message. A send error (the client
// went away) cancels the audit. As Audit, it ends with 503
// STORE_UNAVAILABLE once its store has not answered one of its reads for
// the store timeout (scanBound).
func (a *auditService) StreamAudit(ctx context.Context, req *connect.Request[v1.StreamAuditRequest], stream *connect.ServerStream[v1.AuditEvent]) error {
	au, ok := a.s.ledger.(auditor)
	if !ok {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this ledger has no streamed audit"))
	}
	ctx, cancel := scanBound(ctx, a.s.storeTimeout)
	defer cancel()
	var (
		mu      sync.Mutex // guards the stream and what follows
		sendErr error
		last    time.Time
		latest  *v1.AuditProgress
	)
	send := func(ev *v1.AuditEvent) { // with mu held
		if sendErr != nil {
			return
		}
		if sendErr = stream.Send(ev); sendErr != nil {
			cancel()
		}
	}
	sendProgress := func() { // with mu held
		if latest == nil || time.Since(last) < auditProgressEvery {
			return
		}
		last = time.Now()
		send(&v1.AuditEvent{Event: &v1.AuditEvent_Progress{Progress: latest}})
	}
	progress := func(p engine.AuditProgress) {
		if p.Done {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		latest = &v1.AuditProgress{Rows: p.Rows, Estimate: p.Estimate, Fraction: p.Fraction}
		sendProgress()
	}
	heartbeat := time.NewTicker(auditProgressEvery / 4)
	stopped, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer heartbeat.Stop()
		for {
			select {
			case <-stopped:
				return
			case <-heartbeat.C:
				mu.Lock()
				sendProgress()
				mu.Unlock()
			}
		}
	}()
	found, err := au.AuditWith(ctx, engine.AuditOptions{SinceCheckpoint: req.Msg.SinceCheckpoint, Progress: progress})
	var result *v1.AuditResponse
	if err == nil {
		// The result's gauges (debts, the USAGE_UNKNOWN backlog) are
		// read under the heartbeat too: on a million accounts that
		// takes seconds.
		mode := auditModeFull
		if req.Msg.SinceCheckpoint {
			mode = auditModeSinceCheckpoint
		}
		result = a.s.auditResponse(ctx, found, mode)
	}
	close(stopped)
	<-done
	if sendErr != nil {
		return sendErr
	}
	if err != nil {
		return scanTimedOut(ctx, auditError(err))
	}
	mu.Lock()
	defer mu.Unlock()
	send(&v1.AuditEvent{Event: &v1.AuditEvent_Result{Result: result}})
	return sendErr
}

// auditError maps an audit's failure (engine.AuditWith's error, which
// begins "audit: " already) to its answer without naming the audit twice.
func auditError(err error) *connect.Error {
	return readError("", ReasonStoreUnavailable, err)
}
