package server

import (
	"context"
	"testing"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
)

// The door's text check of a typical Reserve (docs: what it costs beside
// the call).
func BenchmarkRequestTextCheckReserve(b *testing.B) {
	req := &v1.ReserveRequest{ReservationId: "gw-1:0123456789abcdef", Subject: "tenant-42", Route: "chat.generate", Region: "eu", Units: map[string]int64{"tokens": 100}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if cerr := checkText(ctx, capledgerv1connect.LedgerServiceReserveProcedure, req); cerr != nil {
			b.Fatal(cerr)
		}
	}
}
