package ledger_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"pgregory.net/rapid"
)

// TestShardLocalProperties drives one shard's local ledger with random
// operations (and random clock steps across its expiry), then reconciles it
// with the central ledger, settles what was left unknown and reconciles
// again. It checks, after every local operation, the four-term equation
// and that nothing is admitted while sealed, expired or overdrawn; and at
// the end that the central ledger stays sound (the harness audits every
// command), that the shard splits its allocation exactly, that unknown
// capacity is never reminted before its receipt, and that the total
// reminted is exactly the allocation minus what was used (capped at the
// allocation), with the rest of the usage charged as debt.
func TestShardLocalProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := newChecked(rt)
		p := policyOf(tokens(1000, 0), ledger.Dimension{Unit: "requests", Burst: 50, MaxOverdraft: 5})
		p.EmergencyMode = true
		g := c.publish(p)
		allocated := ledger.Amounts{rapid.Int64Range(1, 1000).Draw(rt, "allocTokens"), rapid.Int64Range(0, 50).Draw(rt, "allocRequests")}
		issue := ledger.Command{Kind: ledger.KindShardIssue, Subject: testSubject.Subject, Route: testSubject.Route,
			Region: testSubject.Region, Units: allocated,
			Shard: &ledger.ShardArgs{ShardID: "sh", GatewayID: "gw", BootEpoch: 1, TTL: time.Minute, KeyID: "k1",
				Sign: ledger.Ed25519ShardSigner(shardKey)}}
		s := c.must(c.apply(issue)).Shard
		l := ledger.NewShardLocal(s)
		now := c.now
		ids := []string{}
		amounts := func(label string) ledger.Amounts {
			return ledger.Amounts{rapid.Int64Range(0, 400).Draw(rt, label+"Tokens"), rapid.Int64Range(0, 20).Draw(rt, label+"Requests")}
		}
		pick := func() string {
			if len(ids) == 0 || rapid.IntRange(0, 9).Draw(rt, "newID") == 0 {
				return fmt.Sprintf("r%d", len(ids))
			}
			return rapid.SampledFrom(ids).Draw(rt, "id")
		}
		steps := rapid.IntRange(0, 60).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			var res ledger.Result
			switch op := rapid.IntRange(0, 7).Draw(rt, "op"); op {
			case 0, 1:
				id := pick()
				before := l.Available
				res = l.Reserve(id, "d-"+id, amounts("reserve"), now)
				if res.Err == nil && !res.Replayed {
					ids = append(ids, id)
					if l.Sealed || !now.Before(s.ExpiresAt) || l.Overdraft != (ledger.Amounts{}) {
						rt.Fatalf("admitted %s while sealed/expired/overdrawn", id)
					}
					for d := range before {
						if res.Reservation.Reserved[d] > before[d] {
							rt.Fatalf("admitted %v with only %v available", res.Reservation.Reserved, before)
						}
					}
				}
			case 2:
				id := pick()
				res = l.Start(id, "op-"+id, now)
			case 3, 4:
				id := pick()
				res = l.Settle(id, "op-"+id, amounts("actual"), now)
			case 5:
				res = l.Release(pick(), now)
			case 6:
				res = l.MarkUsageUnknown(pick(), now)
			case 7:
				if rapid.Bool().Draw(rt, "seal") {
					l.Seal(now)
				} else {
					now = now.Add(time.Duration(rapid.IntRange(1, 40).Draw(rt, "seconds")) * time.Second)
				}
			}
			if err := l.Check(); err != nil {
				rt.Fatalf("after op %d: %v", i, err)
			}
		}
		l.Seal(now)
		if err := l.Check(); err != nil {
			rt.Fatal(err)
		}
		var used, unknown ledger.Amounts
		for _, r := range l.Reservations() {
			for d := range used {
				switch r.State {
				case ledger.StateSettled, ledger.StateSettledWithDebt:
					used[d] += r.Actual[d]
				case ledger.StateStarted, ledger.StateUsageUnknown:
					unknown[d] += r.Reserved[d]
				case ledger.StateReserved:
					rt.Fatalf("%s is RESERVED after seal", r.ID)
				}
			}
		}
		if unknown != l.Reserved {
			rt.Fatalf("unknown holds %v, local reserved %v", unknown, l.Reserved)
		}
		c.now = now
		receipts, ok := l.Submission()
		if !ok {
			rt.Fatal("a sealed, unsubmitted shard has no submission")
		}
		before := c.account(g).Balances
		res := c.must(c.apply(ledger.Command{Kind: ledger.KindShardReconcile,
			Shard: &ledger.ShardArgs{ShardID: "sh", GatewayID: "gw", Receipts: receipts}}))
		l.Submitted(receipts)
		got := res.Shard
		var debt ledger.Amounts
		for d := range allocated {
			if got.Unknown[d] != unknown[d] {
				rt.Fatalf("dimension %d: central unknown %d, local unknown %d", d, got.Unknown[d], unknown[d])
			}
			if got.Spent[d]+got.Unknown[d]+got.Reminted[d] != allocated[d] {
				rt.Fatalf("dimension %d: shard split %+v", d, got)
			}
			wantDebt := max(0, used[d]+unknown[d]-allocated[d])
			var moved, charged ledger.Units
			if res.Move != nil {
				moved, charged = res.Move.Units[d], res.Move.Debt[d]
			}
			debt[d] += charged
			if moved != got.Reminted[d] || charged != wantDebt {
				rt.Fatalf("dimension %d: move %d units %d debt, shard reminted %d, want debt %d", d, moved, charged, got.Reminted[d], wantDebt)
			}
			if after := c.account(g).Balances[d]; after.Minted-before[d].Minted != moved {
				rt.Fatalf("dimension %d: minted %d, moved %d", d, after.Minted-before[d].Minted, moved)
			}
		}

		// Resolve every unknown hold with a random usage and report it.
		for _, r := range l.Reservations() {
			if r.State == ledger.StateStarted || r.State == ledger.StateUsageUnknown {
				actual := amounts("late")
				if res := l.Settle(r.ID, "op-"+r.ID, actual, now); res.Err != nil {
					rt.Fatal(res.Err)
				}
				for d := range used {
					used[d] += actual[d]
				}
			}
		}
		if late, ok := l.Submission(); ok {
			res := c.must(c.apply(ledger.Command{Kind: ledger.KindShardReconcile,
				Shard: &ledger.ShardArgs{ShardID: "sh", GatewayID: "gw", Receipts: late}}))
			l.Submitted(late)
			got = res.Shard
			if res.Move != nil {
				for d := range debt {
					debt[d] += res.Move.Debt[d]
				}
			}
		}
		if _, pending := l.Reconciled(); pending != 0 {
			rt.Fatalf("%d receipts still pending", pending)
		}
		for d := range allocated {
			if got.Unknown[d] != 0 || got.Spent[d]+got.Reminted[d] != allocated[d] {
				rt.Fatalf("dimension %d after every receipt: %+v", d, got)
			}
			if got.Reminted[d] < allocated[d]-used[d] {
				rt.Fatalf("dimension %d: reminted %d, yet only %d of %d were used", d, got.Reminted[d], used[d], allocated[d])
			}
			if got.Spent[d]+debt[d] != used[d] {
				rt.Fatalf("dimension %d: spent %d + charged debt %d, but %d were used", d, got.Spent[d], debt[d], used[d])
			}
		}
		// A replay of the whole submission changes nothing.
		again := c.apply(ledger.Command{Kind: ledger.KindShardReconcile,
			Shard: &ledger.ShardArgs{ShardID: "sh", GatewayID: "gw", Receipts: receipts}})
		if !errors.Is(again.Err, ledger.ErrShardAlreadyReconciled) {
			rt.Fatalf("replayed submission: %v", again.Err)
		}
	})
}

// TestShardLocalRefusesIDsTheServerRefuses: a reservation id the
// server's ReconcileShard would refuse as a receipt id (empty, over
// MaxIDBytes, holding a NUL byte) is refused at local reserve time, so
// that one such reservation cannot get the whole reconciliation refused.
func TestShardLocalRefusesIDsTheServerRefuses(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(1000, 0))
	p.EmergencyMode = true
	c.publish(p)
	issue := ledger.Command{Kind: ledger.KindShardIssue, Subject: testSubject.Subject, Route: testSubject.Route,
		Region: testSubject.Region, Units: ledger.Amounts{100},
		Shard: &ledger.ShardArgs{ShardID: "sh", GatewayID: "gw", BootEpoch: 1, TTL: time.Minute, KeyID: "k1",
			Sign: ledger.Ed25519ShardSigner(shardKey)}}
	l := ledger.NewShardLocal(c.must(c.apply(issue)).Shard)
	longest := strings.Repeat("x", ledger.MaxIDBytes)
	for _, id := range []string{"", longest + "x", "a\x00b"} {
		res := l.Reserve(id, "d", ledger.Amounts{1}, c.now)
		if !errors.Is(res.Err, ledger.ErrInvalidCommand) || ledger.IDProblem(id) == "" {
			t.Errorf("reserve %q (%d bytes): %v", id, len(id), res.Err)
		}
	}
	if res := l.Reserve(longest, "d", ledger.Amounts{1}, c.now); res.Err != nil {
		t.Fatalf("reserve with a %d-byte id: %v", len(longest), res.Err)
	}
	if got := len(l.Reservations()); got != 1 || l.Available[0] != 99 {
		t.Fatalf("%d reservations, %d available; want 1 and 99", got, l.Available[0])
	}
}

// A gateway's local shard ledger settles once: a retry with the same
// operation and usage replays, one with other usage is
// ErrReservationAlreadySettled and changes nothing (as the central ledger
// answers).
func TestShardLocalSettleRetryWithOtherUsageIsAlreadySettled(t *testing.T) {
	s := &ledger.Shard{ID: "sh-1", GatewayID: "gw-a", Allocated: ledger.Amounts{100}, ExpiresAt: t0.Add(time.Minute)}
	l := ledger.NewShardLocal(s)
	if res := l.Reserve("a", "d", ledger.Amounts{50}, t0); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := l.Start("a", "op", t0); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := l.Settle("a", "op", ledger.Amounts{30}, t0); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := l.Settle("a", "op", ledger.Amounts{30}, t0); res.Err != nil || !res.Replayed {
		t.Fatalf("the same settle again: %+v, want a replay", res)
	}
	if res := l.Settle("a", "op", ledger.Amounts{45}, t0); !errors.Is(res.Err, ledger.ErrReservationAlreadySettled) {
		t.Fatalf("a settle with other usage: %v, want ErrReservationAlreadySettled", res.Err)
	}
	if l.Spent[0] != 30 || l.Available[0] != 70 {
		t.Fatalf("after the refused settle: spent %d, available %d; want 30 and 70", l.Spent[0], l.Available[0])
	}
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
}

// A shard admits until its ExpiresAt, not at it: a reserve one nanosecond
// before is admitted, one at ExpiresAt is ErrShardExpired (as VerifyShard
// rules at the same instant).
func TestShardLocalAdmitsUntilItsExpiresAt(t *testing.T) {
	s := &ledger.Shard{ID: "sh-1", GatewayID: "gw-a", Allocated: ledger.Amounts{100}, ExpiresAt: t0.Add(time.Minute)}
	l := ledger.NewShardLocal(s)
	if res := l.Reserve("a", "d", ledger.Amounts{1}, s.ExpiresAt.Add(-time.Nanosecond)); res.Err != nil {
		t.Fatalf("reserve 1ns before the shard expires: %v", res.Err)
	}
	if res := l.Reserve("b", "d", ledger.Amounts{1}, s.ExpiresAt); !errors.Is(res.Err, ledger.ErrShardExpired) {
		t.Fatalf("reserve at the shard's ExpiresAt: %v, want ErrShardExpired", res.Err)
	}
}
