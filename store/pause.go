package store

import "context"

type pauseKey struct{}

// WithPause returns ctx carrying pause, which a store's long copies
// inside one read (SQLite's audit spill) call every few hundred rows, so
// that the caller's pacing (engine's maintenance share) applies to them
// too: pause times the work since its last call and sleeps as the
// pacing says, returning early when ctx ends.
func WithPause(ctx context.Context, pause func()) context.Context {
	return context.WithValue(ctx, pauseKey{}, pause)
}

// Pause calls ctx's pause (WithPause), if ctx carries one.
func Pause(ctx context.Context) {
	if pause, ok := ctx.Value(pauseKey{}).(func()); ok {
		pause()
	}
}
