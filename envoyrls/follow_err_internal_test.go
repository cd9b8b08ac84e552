package envoyrls

import (
	"fmt"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// A failed follow-up of a check's reserve is reported by the command that
// failed: the release that replaced a refused request's start says
// "release", and a planned start or settle says "start" or "settle".
func TestFollowErrNamesTheCommandThatFailed(t *testing.T) {
	const rid = "envoy:req-1/acme/chat/global"
	planned := func() item {
		it := item{rid: rid}
		it.cmdBuf = [3]ledger.Command{
			{Kind: ledger.KindReserve, ReservationID: rid},
			{Kind: ledger.KindStart, ReservationID: rid},
			{Kind: ledger.KindSettle, ReservationID: rid},
		}
		it.cmds = it.cmdBuf[:3]
		return it
	}
	failed := fmt.Errorf("%w: %s", ledger.ErrReservationNotFound, rid)
	for _, c := range []struct {
		name     string
		released bool
		results  []ledger.Result
		want     string
	}{
		// Another descriptor refused the request: the hold's release ran
		// in place of its start and settle.
		{"release", true, []ledger.Result{{}, {Err: failed}}, "release " + rid + ":"},
		{"start", false, []ledger.Result{{}, {Err: failed}, {}}, "start " + rid + ":"},
		{"settle", false, []ledger.Result{{}, {}, {Err: failed}}, "settle " + rid + ":"},
	} {
		t.Run(c.name, func(t *testing.T) {
			it := planned()
			it.released, it.results = c.released, c.results
			err := followErr(&it)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("followErr = %v, want it to say %q", err, c.want)
			}
		})
	}
}
