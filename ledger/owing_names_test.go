package ledger_test

import (
	"strings"
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

// A subject's left_behind rows begin with LeftBehindNamesOf, no other
// subject's do, and OwingSetOfLeftBehind names the subject's owing set
// from one: a store locks them with that set (store/postgres).
func TestLeftBehindNamesBelongToTheirSubject(t *testing.T) {
	slashed := ledger.PolicyKey{Subject: "team/a", Route: "chat/gen", Region: "eu"}
	longer := ledger.PolicyKey{Subject: "team/a", Route: "chat/gen", Region: "eu-west"}
	for _, s := range []ledger.PolicyKey{slashed, longer} {
		name := ledger.MetaLeftBehind(s, "images/hd")
		if !strings.HasPrefix(name, ledger.LeftBehindNamesOf(s)) {
			t.Errorf("%q does not begin with its subject's %q", name, ledger.LeftBehindNamesOf(s))
		}
		if set, ok := ledger.OwingSetOfLeftBehind(name); !ok || set != ledger.OwingMetaName(s) {
			t.Errorf("OwingSetOfLeftBehind(%q) = %q, %v; want %q", name, set, ok, ledger.OwingMetaName(s))
		}
	}
	if strings.HasPrefix(ledger.MetaLeftBehind(longer, "tokens"), ledger.LeftBehindNamesOf(slashed)) {
		t.Errorf("a subject's left_behind row begins with another subject's prefix")
	}
	for _, name := range []string{ledger.OwingMetaName(slashed), "left_behind/t/r", "shard_unknown/s/r/u"} {
		if set, ok := ledger.OwingSetOfLeftBehind(name); ok {
			t.Errorf("OwingSetOfLeftBehind(%q) = %q, true; want no left_behind row", name, set)
		}
	}
}
