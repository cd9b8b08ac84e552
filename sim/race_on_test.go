//go:build race

package sim

// raceEnabled shrinks the smoke run under the race detector, which slows
// the simulation tenfold; the parallel runner is what the race run checks.
const raceEnabled = true
