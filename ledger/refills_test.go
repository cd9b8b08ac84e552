package ledger

import (
	"testing"
	"time"
)

// Refills is the one answer to "does this dimension refill": both the
// units and the interval above zero. Each case also says whether a policy
// with the dimension validates: for every one that does, Refills is
// RefillUnits > 0, the test the ledger's refill and Retry-After made
// before Refills existed, so no caller answers differently for a
// published policy.
func TestDimensionRefills(t *testing.T) {
	cases := []struct {
		name     string
		units    Units
		interval time.Duration
		valid    bool
		want     bool
	}{
		{"units per interval", 10, time.Minute, true, true},
		{"one unit per shortest interval", 1, MinRefillInterval, true, true},
		{"the most units per interval", MaxUnits, time.Hour, true, true},
		{"no refill rule", 0, 0, true, false},
		{"an interval with no units", 0, time.Second, true, false},
		{"units with no interval", 10, 0, false, false},
		{"units with a negative interval", 10, -time.Second, false, false},
		{"negative units", -1, time.Second, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Dimension{Unit: "tokens", Burst: 100, RefillUnits: c.units, RefillInterval: c.interval}
			if got := d.Refills(); got != c.want {
				t.Errorf("Refills() of %d per %s = %v, want %v", c.units, c.interval, got, c.want)
			}
			p := Policy{Key: PolicyKey{Subject: "tenant-a", Route: "chat"}, Dimensions: []Dimension{d}}.WithDefaults()
			err := p.Validate()
			if (err == nil) != c.valid {
				t.Fatalf("Validate() = %v, want valid %v", err, c.valid)
			}
			if err == nil && d.Refills() != (d.RefillUnits > 0) {
				t.Errorf("validated %d per %s: Refills() = %v, RefillUnits > 0 = %v", c.units, c.interval, d.Refills(), d.RefillUnits > 0)
			}
		})
	}
}
