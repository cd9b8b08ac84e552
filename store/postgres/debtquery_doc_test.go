package postgres_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The query docs/OPERATIONS.md ("Debt-frozen accounts") gives operators
// for who owes on PostgreSQL runs against a real schema holding debt and
// names each owing dimension by its unit, as capledger debts does, not by
// its position in the policy: one account owing in both of its two
// dimensions, settled above its reservation through the store's own
// write path, lists tokens 100 and requests 2.
func TestOperationsDebtQueryNamesTheUnit(t *testing.T) {
	doc, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	const intro = "### Debt-frozen accounts"
	_, section, ok := strings.Cut(string(doc), intro)
	if !ok {
		t.Fatalf("OPERATIONS.md has no section %q", intro)
	}
	_, query, ok := strings.Cut(section, "```\n")
	if !ok {
		t.Fatalf("OPERATIONS.md's %q has no query", intro)
	}
	query, _, _ = strings.Cut(query, "```")

	s, dsn := openStore(t)
	policy := ledger.Policy{
		Key: tenant7,
		Dimensions: []ledger.Dimension{
			{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: time.Hour, MaxOverdraft: 500},
			{Unit: "requests", Burst: 10, RefillUnits: 1, RefillInterval: time.Hour, MaxOverdraft: 5},
		},
		HoldTTL: 30 * time.Second,
	}.WithDefaults()
	res := commitCmds(t, s, t0, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy})
	if res[0].Err != nil {
		t.Fatalf("publish: %v", res[0].Err)
	}
	reserve := ledger.Command{Kind: ledger.KindReserve, ReservationID: "rl-1", RequestDigest: "sha256:rl-1",
		Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: ledger.Amounts{1000, 10}}
	for i, cmd := range []ledger.Command{
		reserve,
		{Kind: ledger.KindStart, ReservationID: "rl-1", OperationID: "op-1"},
		{Kind: ledger.KindSettle, ReservationID: "rl-1", OperationID: "op-1", Units: ledger.Amounts{1100, 12}},
	} {
		if res := commitCmds(t, s, t0.Add(time.Duration(i)*time.Second), cmd)[0]; res.Err != nil {
			t.Fatalf("%v: %v", cmd.Kind, res.Err)
		}
	}

	rows, err := connectTo(t, dsn).Query(context.Background(), query)
	if err != nil {
		t.Fatalf("OPERATIONS.md's debt query: %v\n%s", err, query)
	}
	owed := map[string]int64{}
	for rows.Next() {
		values, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		row := map[string]any{}
		for i, field := range rows.FieldDescriptions() {
			row[field.Name] = values[i]
		}
		unit, isName := row["unit"].(string)
		debt, isCount := row["debt"].(int64)
		if !isName || !isCount || row["subject"] != tenant7.Subject {
			t.Fatalf("OPERATIONS.md's debt query answered a row %v: want subject, a unit's name as unit and debt\n%s", row, query)
		}
		owed[unit] = debt
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(owed) != 2 || owed["tokens"] != 100 || owed["requests"] != 2 {
		t.Errorf("OPERATIONS.md's debt query lists %v, want tokens 100 and requests 2\n%s", owed, query)
	}
}
