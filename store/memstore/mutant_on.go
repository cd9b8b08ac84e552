//go:build capledger_mutants

package memstore

import (
	"os"
	"slices"
)

// mutantOn reports whether the named, deliberately broken variant of the
// in-memory store is switched on: CAPLEDGER_MUTANT names it (as for the
// ledger's, ledger/mutant_on.go). The variants break journal compaction:
//
//   - compaction_drops_entry: JournalCompact deletes one entry more than
//     the last checkpoint summarises (the first entry after it);
//   - checkpoint_wrong_closing: the checkpoint writer's Finish stores it with
//     one unit more minted and available in its first account's closing
//     vector (which still balances), sealed again so that its digests
//     still verify.
//
// A name not in mutantNames panics (as the ledger's).
func mutantOn(name string) bool {
	if !slices.Contains(mutantNames, name) {
		panic("memstore: mutant " + name + " is not in mutantNames")
	}
	return os.Getenv("CAPLEDGER_MUTANT") == name
}

// mutantNames are the variants above.
var mutantNames = []string{"compaction_drops_entry", "checkpoint_wrong_closing"}

// MutantNames returns the names CAPLEDGER_MUTANT can select in the
// in-memory store (none without the capledger_mutants build tag).
func MutantNames() []string { return slices.Clone(mutantNames) }
