package ledger

import (
	"testing"
	"time"
)

// DrainRoom is the room a drain has in the deciding account: its refill
// due at now first (only when it refills), then the burst's room above
// available and reserved, plus its debt, which the units moved repay.
func TestDrainRoom(t *testing.T) {
	t0 := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	p := &Policy{Dimensions: []Dimension{{Unit: "tokens", Burst: 50, RefillUnits: 10, RefillInterval: time.Minute}}}
	at := func(available, reserved, debt Units) *Account {
		a := &Account{Dims: 1}
		a.Balances[0] = Balance{Available: available, Reserved: reserved, OverdraftIssued: debt}
		a.RefilledTo[0] = t0.UnixNano()
		return a
	}
	cases := []struct {
		name    string
		to      *Account
		refills bool
		now     time.Time
		want    Units
	}{
		{"room as stored, nothing due", at(20, 0, 0), true, t0, 30},
		{"refill due fills it", at(20, 0, 0), true, t0.Add(10 * time.Minute), 0},
		{"refill due leaves room", at(20, 0, 0), true, t0.Add(2 * time.Minute), 10},
		{"no refill where it does not refill", at(20, 0, 0), false, t0.Add(10 * time.Minute), 30},
		{"held units fill the burst", at(10, 40, 0), false, t0, 0},
		{"debt is room at a full burst", at(0, 50, 15), false, t0, 15},
		{"refill repays debt first", at(0, 50, 15), true, t0.Add(time.Minute), 5},
	}
	for _, c := range cases {
		before := *c.to
		if got := DrainRoom(p, c.to, 0, c.refills, c.now); got != c.want {
			t.Errorf("%s: DrainRoom = %d, want %d", c.name, got, c.want)
		}
		if *c.to != before {
			t.Errorf("%s: DrainRoom changed the account: %+v, was %+v", c.name, *c.to, before)
		}
	}
}
