//go:build !capledger_mutants

package ledger

// mutantOn reports whether the named, deliberately broken variant of the
// ledger is switched on (the simulator's mutation tests use them to show it
// catches real bugs). Without the capledger_mutants build tag it is always
// false, and the compiler drops the lines it guards.
func mutantOn(string) bool { return false }

// MutantNames returns the names CAPLEDGER_MUTANT can select in the
// ledger: none without the capledger_mutants build tag.
func MutantNames() []string { return nil }
