package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// MutantNames returns the deliberately broken variants CAPLEDGER_MUTANT
// can select in this binary (the ledger's and the in-memory store's),
// sorted: none without the capledger_mutants build tag.
func MutantNames() []string {
	names := append(ledger.MutantNames(), memstore.MutantNames()...)
	slices.Sort(names)
	return names
}

// CheckMutant returns nil when name (the value of CAPLEDGER_MUTANT) is
// empty or selects a mutant this binary has, and otherwise an error that
// says why and lists the known names. A name no variant reads would run
// the unmutated code and pass, as if the simulator had missed the bug.
func CheckMutant(name string) error {
	if name == "" {
		return nil
	}
	names := MutantNames()
	if len(names) == 0 {
		return fmt.Errorf("CAPLEDGER_MUTANT=%s: this binary has no mutants (it would run unmutated); unset it, or build with: go build -tags capledger_mutants ./cmd/capledger", name)
	}
	if !slices.Contains(names, name) {
		return fmt.Errorf("CAPLEDGER_MUTANT=%s: no such mutant; the known ones: %s", name, strings.Join(names, ", "))
	}
	return nil
}
