package client

import (
	"context"
	"errors"
	"testing"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// A validation refusal's ErrorDetail.field reaches the caller as
// LedgerError.Field, from a real server over a socket: the path of the
// refused field in a unary call's request, and within a batch item,
// relative to the item (docs/API.md, "Field paths").
func TestLedgerErrorCarriesTheRefusedField(t *testing.T) {
	l := startLedger(t)
	ctx := context.Background()

	_, _, err := l.direct.PublishPolicy(ctx, &ledgerv1.Policy{Subject: "tenant-7", Route: "chat.generate",
		Dimensions: []*ledgerv1.Dimension{{Unit: "requests", Burst: 10}, {Unit: "tokens", Burst: 10, MaxReservation: 11}}})
	var le *LedgerError
	if !errors.As(err, &le) {
		t.Fatalf("publish of maxReservation above burst: %v, want a *LedgerError", err)
	}
	if le.Field != "policy.dimensions[1].maxReservation" {
		t.Errorf("LedgerError.Field = %q, want policy.dimensions[1].maxReservation (%v)", le.Field, err)
	}

	outcomes, err := l.direct.SettleBatch(ctx, []SettleItem{{ReservationID: "r-1", OperationID: "op-1", Actual: Units{"tokens": 1}}, {ReservationID: "r-2", Actual: Units{"tokens": 1}}})
	if err != nil {
		t.Fatal(err)
	}
	le = nil
	if !errors.As(outcomes[1].Err, &le) {
		t.Fatalf("settle item without its operation id: %v, want a *LedgerError", outcomes[1].Err)
	}
	if le.Field != "operationId" {
		t.Errorf("the item's LedgerError.Field = %q, want operationId (%v)", le.Field, outcomes[1].Err)
	}
	le = nil
	if errors.As(outcomes[0].Err, &le) && le.Field != "" {
		t.Errorf("a refusal that is no validation's carries Field %q (%v)", le.Field, outcomes[0].Err)
	}
}
