package store

import "context"

type pauseKey struct{}

// WithPause returns ctx carrying pause, which a store's long copies
// inside one read (SQLite's audit copy) call after every short step with
// how far they got, in rows (reservations and journal entries, the
// units of ledger.Snapshot.Estimate; SQLite's copies pages and counts
// their share of the estimate), so that the caller's pacing (engine's
// maintenance share) applies to them too and the caller can report their
// progress: pause times the work since its last call and sleeps as the
// pacing says, or counts the sleep and takes it once the read has ended
// (the engine, for SQLite's audit copy), returning early when ctx ends.
func WithPause(ctx context.Context, pause func(copied int64)) context.Context {
	return context.WithValue(ctx, pauseKey{}, pause)
}

// Pause calls ctx's pause (WithPause) with copied, if ctx carries one.
func Pause(ctx context.Context, copied int64) {
	if pause, ok := ctx.Value(pauseKey{}).(func(int64)); ok {
		pause(copied)
	}
}
