package ledger_test

import (
	"testing"

	"github.com/capledger/capledger/ledger"
)

// OwingSetOf names the owing set of a set's own row and of its member
// rows, and of no other Meta row: a store ranks and locks a subject's
// owing rows by it (store/postgres), so a member row taken for another
// subject's, or a foreign row taken for an owing one, breaks its order.
func TestOwingSetOfNamesTheSetOfItsRows(t *testing.T) {
	slashed := ledger.PolicyKey{Subject: "team/a", Route: "chat/gen", Region: "eu"}
	set := ledger.OwingMetaName(slashed)
	plain := ledger.OwingMetaName(ledger.PolicyKey{Subject: "t", Route: "r", Region: "eu"})
	for _, c := range []struct {
		name, set string
		ok        bool
	}{
		{set, set, true},
		{set + "/0", set, true},
		{set + "/12", set, true},
		{plain + "/3", plain, true},
		{"left_behind/t/r/eu/images", "", false},
		{"owing/t/r", "", false},
		{"shard_unknown/s/r", "", false},
	} {
		got, ok := ledger.OwingSetOf(c.name)
		if got != c.set || ok != c.ok {
			t.Errorf("OwingSetOf(%q) = %q, %v; want %q, %v", c.name, got, ok, c.set, c.ok)
		}
	}
}
