package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// A new leader's first epoch pass closes an account whose epoch ends
// exactly at the pass's clock (EpochPager: due when EpochStart +
// EpochLength <= now), both when it reads the generations one by one
// (at most freshPerGeneration of them) and when it reads them together
// from the start of the index across generations (more); a pass a
// nanosecond earlier closes nothing. The two reads must agree on the
// boundary, or which epochs close on time would depend on how many
// policies were ever published.
func TestFirstEpochPassClosesAnEpochEndingExactlyNow(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		for _, generations := range []int{freshPerGeneration, freshPerGeneration + 14} {
			st := open(t)
			core := NewCore(st)
			publishTenants(t, core, t0, 0, generations)
			reserveFor(t, core, t0.Add(time.Minute), 0, "busy") // tenant-0000: 10-minute epochs
			accounts, err := st.AccountList(context.Background(), ledger.PolicyKey{Subject: "tenant-0000", Route: "chat.generate", Region: "eu"})
			if err != nil || len(accounts) != 1 {
				t.Fatalf("%s: accounts of tenant-0000: %v %v", name, accounts, err)
			}
			busy := accounts[0]
			ends := busy.EpochStart.Add(epochLengthsOfTest[0])

			var early EpochScans
			if cmds := epochPass(t, core, ends.Add(-time.Nanosecond), &early); len(cmds) != 0 {
				t.Errorf("%s, %d generations: a pass a nanosecond before the epoch ends closes %v", name, generations, cmds)
			}
			var first EpochScans // a new leader: no pass remembered
			cmds := epochPass(t, core, ends, &first)
			if len(cmds) != 1 || cmds[0].Kind != ledger.KindCloseEpoch || cmds[0].Account != busy.Key {
				t.Errorf("%s, %d generations: a new leader's pass at the epoch's end %s closes %v, want tenant-0000's %s",
					name, generations, ends, cmds, busy.Key)
			}
		}
	}
}
