package store

import (
	"context"
	"time"
)

type pauseKey struct{}

// WithPause returns ctx carrying pause, which a store's long copies
// inside one read (SQLite's audit spill) call after every step of work
// with the time the step took, so that the caller's pacing (engine's
// maintenance share) applies to them too. pause sleeps as the pacing
// says and returns early when ctx ends.
func WithPause(ctx context.Context, pause func(took time.Duration)) context.Context {
	return context.WithValue(ctx, pauseKey{}, pause)
}

// Pause calls ctx's pause (WithPause) with took, if ctx carries one.
func Pause(ctx context.Context, took time.Duration) {
	if pause, ok := ctx.Value(pauseKey{}).(func(time.Duration)); ok {
		pause(took)
	}
}
