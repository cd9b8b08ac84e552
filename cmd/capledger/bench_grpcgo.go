package main

import (
	"context"
	"fmt"

	"google.golang.org/grpc/metadata"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/client"
)

// grpcGoOp is the op of --mode reserve, lifecycle or batch with
// --protocol grpc-go: the LedgerService called with a grpc-go client
// (conn.Invoke with capledger's message types, one HTTP/2 connection), the
// client stack of gubernator's gRPC baseline, instead of the SDK's
// connect-go client. Setup and prefill still go through the SDK.
func grpcGoOp(ctx context.Context, cfg *benchConfig) (func(context.Context, *benchWorker) (int, error), error) {
	if cfg.setup || cfg.prefill {
		if _, err := ledgerOp(ctx, cfg); err != nil {
			return nil, err
		}
	}
	conn, err := grpcGoConn(cfg, "grpc-go")
	if err != nil {
		return nil, err
	}
	var md metadata.MD
	if cfg.conn.token != "" {
		md = metadata.Pairs("authorization", "Bearer "+cfg.conn.token)
	}
	call := func(ctx context.Context, procedure string, req, resp any) error {
		if md != nil {
			ctx = metadata.NewOutgoingContext(ctx, md)
		}
		return conn.Invoke(ctx, procedure, req, resp)
	}
	units := map[string]int64{"tokens": cfg.units}
	reserve := func(w *benchWorker) *v1.ReserveRequest {
		return &v1.ReserveRequest{ReservationId: client.NewReservationID(), Subject: w.subject(cfg), Route: cfg.route, Units: units}
	}
	switch cfg.mode {
	case "reserve":
		return func(ctx context.Context, w *benchWorker) (int, error) {
			var resp v1.ReserveResponse
			if err := call(ctx, capledgerv1connect.LedgerServiceReserveProcedure, reserve(w), &resp); err != nil {
				return 0, err
			}
			return 1, nil
		}, nil
	case "lifecycle":
		return func(ctx context.Context, w *benchWorker) (int, error) {
			req := reserve(w)
			var reserved v1.ReserveResponse
			if err := call(ctx, capledgerv1connect.LedgerServiceReserveProcedure, req, &reserved); err != nil {
				return 0, err
			}
			op := client.NewOperationID()
			var started v1.StartResponse
			if err := call(ctx, capledgerv1connect.LedgerServiceStartProcedure, &v1.StartRequest{ReservationId: req.ReservationId, OperationId: op}, &started); err != nil {
				return 0, err
			}
			var settled v1.SettleResponse
			if err := call(ctx, capledgerv1connect.LedgerServiceSettleProcedure, &v1.SettleRequest{ReservationId: req.ReservationId, OperationId: op, ActualUnits: units}, &settled); err != nil {
				return 0, err
			}
			return 1, nil
		}, nil
	case "batch":
		return func(ctx context.Context, w *benchWorker) (int, error) {
			req := &v1.ReserveBatchRequest{Requests: make([]*v1.ReserveRequest, cfg.batchSize)}
			for i := range req.Requests {
				req.Requests[i] = reserve(w)
			}
			var resp v1.ReserveBatchResponse
			if err := call(ctx, capledgerv1connect.LedgerServiceReserveBatchProcedure, req, &resp); err != nil {
				return 0, err
			}
			ok := 0
			var itemErr error
			for _, o := range resp.GetOutcomes() {
				if o.GetOk() != nil {
					ok++
				} else if itemErr == nil {
					itemErr = fmt.Errorf("%s: %s", o.GetError().GetCode(), o.GetError().GetMessage())
				}
			}
			return ok, itemErr
		}, nil
	}
	return nil, usagef("--protocol grpc-go drives --mode reserve, lifecycle, batch, envoy or gubernator, not %s", cfg.mode)
}
