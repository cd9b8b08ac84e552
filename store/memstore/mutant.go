//go:build !capledger_mutants

package memstore

// mutantOn reports whether the named, deliberately broken variant of the
// in-memory store is switched on (the simulator's mutation tests, as
// ledger's mutantOn). Without the capledger_mutants build tag it is always
// false, and the compiler drops the lines it guards.
func mutantOn(string) bool { return false }

// MutantNames returns the names CAPLEDGER_MUTANT can select in the
// in-memory store: none without the capledger_mutants build tag.
func MutantNames() []string { return nil }
