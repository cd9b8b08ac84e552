package server_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/server"
)

// GetShard reports each asked receipt's central standing, and a late
// receipt releasing work reported started is refused with
// SHARD_RECEIPT_CONTRADICTS and changes nothing (issue 23).
func TestShardReceiptStandingsAndContradictions(t *testing.T) {
	h := newShardHarness(t)
	ctx := context.Background()
	h.publish(t, true)
	if _, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-1", "gw-a", 300))); err != nil {
		t.Fatal(err)
	}
	receipt := func(id string, state v1.ReservationState, actual int64) *v1.ShardReceipt {
		return &v1.ShardReceipt{ReservationId: id, State: state,
			ReservedUnits: map[string]int64{"tokens": 100, "requests": 1}, ActualUnits: map[string]int64{"tokens": actual, "requests": 1}}
	}
	if _, err := h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-a", Receipts: []*v1.ShardReceipt{
		receipt("done", v1.ReservationState_RESERVATION_STATE_SETTLED, 60),
		receipt("running", v1.ReservationState_RESERVATION_STATE_STARTED, 0),
		receipt("lost", v1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN, 0),
	}})); err != nil {
		t.Fatal(err)
	}
	_, err := h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-a", Receipts: []*v1.ShardReceipt{
		receipt("running", v1.ReservationState_RESERVATION_STATE_RELEASED, 0)}}))
	wantShardError(t, err, connect.CodeFailedPrecondition, server.ReasonShardReceiptContradicts)
	if _, err := h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-a", Receipts: []*v1.ShardReceipt{
		receipt("running", v1.ReservationState_RESERVATION_STATE_SETTLED, 80)}})); err != nil {
		t.Fatal(err)
	}
	got, err := h.shards.GetShard(ctx, connect.NewRequest(&v1.GetShardRequest{ShardId: "sh-1", ReceiptIds: []string{"lost", "done", "running", "never"}}))
	if err != nil {
		t.Fatal(err)
	}
	want := []v1.ShardReceiptStanding_Standing{
		v1.ShardReceiptStanding_STANDING_PENDING, v1.ShardReceiptStanding_STANDING_NOT_PENDING,
		v1.ShardReceiptStanding_STANDING_RESOLVED, v1.ShardReceiptStanding_STANDING_NOT_PENDING,
	}
	if len(got.Msg.Receipts) != len(want) {
		t.Fatalf("standings %v", got.Msg.Receipts)
	}
	for i, st := range got.Msg.Receipts {
		if st.Standing != want[i] || st.ReservationId != []string{"lost", "done", "running", "never"}[i] {
			t.Fatalf("standing %d: %v, want %v", i, st, want[i])
		}
	}
	if sh := got.Msg.Shard; sh.UnknownUnits["tokens"] != 100 || sh.SpentUnits["tokens"] != 140 || sh.RefusedSubmissions != 1 {
		t.Fatalf("shard after the refused and the settled late receipt: %+v", sh)
	}
	// An empty receipt id names no receipt: refused naming it, not
	// answered as a receipt that is not pending.
	_, err = h.shards.GetShard(ctx, connect.NewRequest(&v1.GetShardRequest{ShardId: "sh-1", ReceiptIds: []string{"lost", ""}}))
	wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonInvalidCommand)
	if !strings.Contains(err.Error(), "receiptIds[1] is required") {
		t.Errorf("empty receipt id: %v", err)
	}
}
