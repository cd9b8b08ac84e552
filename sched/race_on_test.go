//go:build race

package sched

// raceEnabled shrinks the million-tenant run under the race detector, which
// slows every call about tenfold.
const raceEnabled = true
