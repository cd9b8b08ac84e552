package storetest

import (
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// t0 is the fixture's clock: the seed's accounting epoch, plus nanoseconds
// so that a store that keeps only microseconds (or seconds) is caught.
var t0 = time.Date(2026, 7, 19, 14, 0, 0, 123456789, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

var (
	keyEU    = ledger.PolicyKey{Subject: "tenant7", Route: "chat.generate", Region: "eu"}
	keyAny   = ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"}
	accEU1   = ledger.AccountKey{Subject: "tenant7", Route: "chat.generate", Region: "eu", Generation: 1}
	accEU2   = ledger.AccountKey{Subject: "tenant7", Route: "chat.generate", Region: "eu", Generation: 2}
	accOther = ledger.AccountKey{Subject: "tenant8", Route: "chat.generate", Region: "eu", Generation: 3}
)

func fixturePolicies() []ledger.Policy {
	tokens := ledger.Dimension{Unit: "tokens", RefillUnits: 100, RefillInterval: time.Second, Burst: 1000,
		MaxReservation: 800, MaxOverdraft: 500}
	requests := ledger.Dimension{Unit: "requests", RefillUnits: 1, RefillInterval: 6 * time.Second, Burst: 10,
		MaxReservation: 2, MaxOverdraft: 1}
	cost := ledger.Dimension{Unit: "micro_usd", RefillUnits: 5000, RefillInterval: time.Minute, Burst: 1_000_000,
		MaxReservation: 250_000}
	return []ledger.Policy{
		{
			Key: keyEU, Generation: 1, Dimensions: []ledger.Dimension{tokens, requests},
			EstimatorDigest: "sha256:71a0c3", HoldTTL: 30 * time.Second, ExecutionLimit: 2 * time.Minute,
			Priority: 2, FairnessWeight: 3, FairnessBudget: 0.05, EmergencyMode: true,
			Rollout: ledger.RolloutShadow, EpochLength: time.Hour, PublishedAt: at(-2 * time.Hour),
			RolledBack: true,
		},
		{
			Key: keyEU, Generation: 2, Dimensions: []ledger.Dimension{tokens, requests, cost},
			EstimatorDigest: "sha256:9f1e77", HoldTTL: 45 * time.Second, ExecutionLimit: 5 * time.Minute,
			Priority: 1, FairnessWeight: 1, FairnessBudget: 0.125, Rollout: ledger.RolloutEnforce,
			EpochLength: 15 * time.Minute, PublishedAt: at(-time.Hour),
		},
		{
			Key: keyAny, Generation: 3, Dimensions: []ledger.Dimension{tokens},
			HoldTTL: time.Minute, FairnessWeight: 1, FairnessBudget: 0.05, Rollout: ledger.RolloutEnforce,
			EpochLength: time.Hour, PublishedAt: at(-time.Minute),
		},
	}
}

// fullBalance returns a balance with all nine terms set (and conserving,
// though a store must not care).
func fullBalance(base int64) ledger.Balance {
	return ledger.Balance{
		Opening: 1000 + base, Minted: 640 + base, OverdraftIssued: 300,
		Available: 410 + base, Reserved: 600, Spent: 520 + base, RetiredForEmergency: 150,
		RetiredForMove: 160, OverdraftRepaid: 100,
	}
}

func fixtureAccounts() []ledger.Account {
	a1 := ledger.Account{
		Key: accEU1, Dims: 2,
		Balances:     ledger.Balances{fullBalance(0), fullBalance(7)},
		EpochStart:   at(-time.Hour),
		EpochOpening: ledger.Balances{{Opening: 1000, Available: 1000}, {Opening: 10, Available: 9, Reserved: 1}},
		RefilledTo:   [ledger.MaxDimensions]int64{at(-time.Second).UnixNano(), at(-6 * time.Second).UnixNano()},
		Breaches:     2, Version: 17,
		// Counted as the subject's current account, in one of its units.
		HeldElsewhere: ledger.Amounts{0, 1},
	}
	a2 := ledger.Account{
		Key: accEU2, Dims: 3,
		Balances:     ledger.Balances{fullBalance(1), fullBalance(2), fullBalance(1 << 40)},
		EpochStart:   at(0),
		EpochOpening: ledger.Balances{fullBalance(1), fullBalance(2), fullBalance(3)},
		RefilledTo:   [ledger.MaxDimensions]int64{at(0).UnixNano(), at(0).UnixNano(), at(-time.Minute).UnixNano()},
		Version:      1,
		// Counted in a dimension past the first, as stored with none before.
		HeldElsewhere: ledger.Amounts{0, 0, 1 << 40},
	}
	a3 := ledger.Account{
		Key: accOther, Dims: 1,
		Balances:   ledger.Balances{{Opening: 1000, Available: 1000}},
		EpochStart: at(0), EpochOpening: ledger.Balances{{Opening: 1000, Available: 1000}},
		RefilledTo: [ledger.MaxDimensions]int64{at(0).UnixNano()},
	}
	return []ledger.Account{a1, a2, a3}
}

// fixtureReservations returns one reservation in every state the ledger
// stores, each with every field set that the state can have.
func fixtureReservations() []ledger.Reservation {
	base := func(id string, state ledger.State) ledger.Reservation {
		return ledger.Reservation{
			ID: id, RequestDigest: "sha256:" + id, Account: accEU2, AccountingEpoch: at(0),
			Reserved: ledger.Amounts{600, 1, 12000}, State: state,
			CreatedAt: at(time.Second), ExpiresAt: at(46 * time.Second),
		}
	}
	started := func(r ledger.Reservation) ledger.Reservation {
		r.OperationID = "op-" + r.ID
		r.StartedAt = at(2 * time.Second)
		r.ExecutionDeadline = at(302 * time.Second)
		return r
	}
	finished := func(r ledger.Reservation, d time.Duration) ledger.Reservation {
		r.FinishedAt = at(d)
		return r
	}
	settled := finished(started(base("rl-settled", ledger.StateSettled)), 9*time.Second)
	settled.Actual = ledger.Amounts{200, 1, 4000}
	debt := finished(started(base("rl-debt", ledger.StateSettledWithDebt)), 400*time.Second)
	debt.Actual = ledger.Amounts{900, 1, 30000}
	debt.Overdraft = ledger.Amounts{300, 0, 18000}
	debt.Breach = true
	debt.UnknownAt = at(303 * time.Second) // past its deadline, then settled late
	unknown := finished(started(base("rl-unknown", ledger.StateUsageUnknown)), 303*time.Second)
	unknown.UnknownAt = at(303 * time.Second)
	return []ledger.Reservation{
		base("rl-requested", ledger.StateRequested),
		base("rl-reserved", ledger.StateReserved),
		started(base("rl-started", ledger.StateStarted)),
		settled,
		debt,
		finished(base("rl-released", ledger.StateReleased), 3*time.Second),
		finished(base("rl-expiring", ledger.StateExpiring), 47*time.Second),
		finished(base("rl-expired", ledger.StateExpired), 48*time.Second),
		unknown,
	}
}

func fixtureMoves() []ledger.Move {
	return []ledger.Move{
		{ReceiptID: "mv-switch-2", Kind: ledger.MoveGenerationSwitch, From: accEU1, To: accEU2,
			Units: ledger.Amounts{410, 9}, Debt: ledger.Amounts{200}, At: at(-time.Hour)},
		{ReceiptID: "mv-forward-rl-late", Kind: ledger.MoveForward, From: accEU1, To: accEU2,
			Units: ledger.Amounts{50}, At: at(time.Minute)},
		{ReceiptID: "mv-remint-sh-1", Kind: ledger.MoveShardRemint, From: accEU1, To: accEU2,
			Units: ledger.Amounts{60, 1}, At: at(2 * time.Minute)},
	}
}

func fixtureShards() []ledger.Shard {
	sig := make([]byte, 64)
	for i := range sig {
		sig[i] = byte(i*7 + 1)
	}
	return []ledger.Shard{
		{ID: "sh-1", Account: accEU1, GatewayID: "gw-a", BootEpoch: 1752933600, Fence: 4,
			Allocated: ledger.Amounts{150, 2}, IssuedAt: at(-90 * time.Minute), ExpiresAt: at(-30 * time.Minute),
			KeyID: "ed25519-2026-07", Signature: sig,
			Reconciled: true, Spent: ledger.Amounts{80, 1}, Unknown: ledger.Amounts{10}, Reminted: ledger.Amounts{60, 1}},
		{ID: "sh-2", Account: accEU2, GatewayID: "gw-b", BootEpoch: 1752937200, Fence: 1,
			Allocated: ledger.Amounts{100}, IssuedAt: at(0), ExpiresAt: at(time.Hour),
			KeyID: "ed25519-2026-07", Signature: sig[:32]},
	}
}

func fixtureStatements() []ledger.Statement {
	return []ledger.Statement{
		{Account: accEU1, EpochStart: at(-3 * time.Hour), EpochEnd: at(-2 * time.Hour), Dims: 2,
			Opening: ledger.Balances{{Opening: 1000, Available: 1000}, {Opening: 10, Available: 10}},
			Closing: ledger.Balances{fullBalance(-5), fullBalance(-6)}},
		{Account: accEU1, EpochStart: at(-2 * time.Hour), EpochEnd: at(-time.Hour), Dims: 2,
			Opening: ledger.Balances{fullBalance(-5), fullBalance(-6)},
			Closing: ledger.Balances{{Opening: 1000, Available: 1000}, {Opening: 10, Available: 9, Reserved: 1}}},
	}
}

func fixtureJournal() []ledger.JournalEntry {
	return []ledger.JournalEntry{
		{At: at(time.Second), Kind: ledger.KindReserve, Account: accEU2, ReservationID: "rl-settled",
			From: ledger.StateRequested, To: ledger.StateReserved,
			Delta: ledger.Balances{{Available: -600, Reserved: 600}, {Available: -1, Reserved: 1}, {Available: -12000, Reserved: 12000}}},
		{At: at(9 * time.Second), Kind: ledger.KindSettle, Account: accEU2, ReservationID: "rl-settled",
			From: ledger.StateStarted, To: ledger.StateSettled,
			Delta: ledger.Balances{{Available: 400, Reserved: -600, Spent: 200}, {Reserved: -1, Spent: 1}, {Available: 8000, Reserved: -12000, Spent: 4000}}},
		{At: at(-time.Hour), Kind: ledger.KindReserve, Account: accEU1, ReceiptID: "mv-switch-2",
			Delta: ledger.Balances{{Available: -410, RetiredForMove: 410, Minted: 200, OverdraftRepaid: 200}}},
		{At: at(2 * time.Minute), Kind: ledger.KindRefill, Account: accEU2,
			Delta: ledger.Balances{{Minted: 100, Available: 100}}},
	}
}

func fixtureHeads() []ledger.PolicyHead {
	return []ledger.PolicyHead{{Key: keyEU, Active: 2, Latest: 2}, {Key: keyAny, Active: 3, Latest: 3}}
}

func fixtureCurrents() []store.Current {
	return []store.Current{{Subject: keyEU, Generation: 2}, {Subject: accOther.SubjectKey(), Generation: 3}}
}

// fixture returns one batch with every kind of row.
func fixture() *store.Changes {
	c := &store.Changes{
		Meta:         map[string]int64{ledger.MetaGeneration: 3, "fixture_counter": -42},
		Policies:     fixturePolicies(),
		Heads:        fixtureHeads(),
		Accounts:     fixtureAccounts(),
		Currents:     fixtureCurrents(),
		Reservations: fixtureReservations(),
		Moves:        fixtureMoves(),
		Shards:       fixtureShards(),
		Statements:   fixtureStatements(),
		Journal:      fixtureJournal(),
	}
	c.NewReservations = map[string]bool{}
	for _, r := range c.Reservations {
		c.NewReservations[r.ID] = true
	}
	return c
}
