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
// call's goroutine, a progress event goes out at most every
// auditProgressEvery, and the result is the last message. A send error
// (the client went away) cancels the audit.
func (a *auditService) StreamAudit(ctx context.Context, req *connect.Request[v1.StreamAuditRequest], stream *connect.ServerStream[v1.AuditEvent]) error {
	au, ok := a.s.ledger.(auditor)
	if !ok {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this ledger has no streamed audit"))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex
		sendErr error
		last    time.Time
	)
	send := func(ev *v1.AuditEvent) {
		mu.Lock()
		defer mu.Unlock()
		if sendErr != nil {
			return
		}
		if sendErr = stream.Send(ev); sendErr != nil {
			cancel()
		}
	}
	progress := func(p engine.AuditProgress) {
		if p.Done || time.Since(last) < auditProgressEvery {
			return
		}
		last = time.Now()
		send(&v1.AuditEvent{Event: &v1.AuditEvent_Progress{Progress: &v1.AuditProgress{
			Rows: p.Rows, Estimate: p.Estimate, Fraction: p.Fraction}}})
	}
	found, err := au.AuditWith(ctx, engine.AuditOptions{SinceCheckpoint: req.Msg.SinceCheckpoint, Progress: progress})
	if sendErr != nil {
		return sendErr
	}
	if err != nil {
		return readError("audit", ReasonStoreUnavailable, err)
	}
	mode := auditModeFull
	if req.Msg.SinceCheckpoint {
		mode = auditModeSinceCheckpoint
	}
	send(&v1.AuditEvent{Event: &v1.AuditEvent_Result{Result: a.s.auditResponse(ctx, found, mode)}})
	return sendErr
}
