//go:build capledger_mutants

package ledger

import "os"

// mutantOn reports whether the named, deliberately broken variant of the
// ledger is switched on: CAPLEDGER_MUTANT names it. Only binaries built with
// the capledger_mutants tag read it; the variants are
//
//   - refund_twice: a release of an already released reservation gives its
//     hold back again instead of replaying;
//   - expire_started: an expiry claim takes a STARTED reservation whose
//     hold ran out;
//   - debt_admits: outstanding debt does not freeze admission;
//   - unknown_without_limit: the execution-limit worker's unknown-marking
//     takes STARTED work whose execution deadline is unset or not passed;
//   - retry_after_ignores_holds: a rejection promises a Retry-After from
//     refill even when only outstanding holds ending can make room.
//
// The variable is read on every call so that a test can switch variants
// between runs in one process.
func mutantOn(name string) bool { return os.Getenv("CAPLEDGER_MUTANT") == name }
