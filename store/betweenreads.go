package store

import "context"

// betweenReadsKey is the context key of WithBetweenReads' hook.
type betweenReadsKey struct{}

// WithBetweenReads returns ctx carrying f, for tests (storetest): a
// driver whose AccountsWithOwing reads with two statements calls f once
// between them (after the accounts, before the owing rows); the in-memory
// store, which reads both in one hold of its lock, calls it after. A test
// commits in f to show that the read is one snapshot. Nothing but
// BetweenReads looks at the value.
func WithBetweenReads(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, betweenReadsKey{}, f)
}

// BetweenReads calls the hook WithBetweenReads put in ctx, if any.
func BetweenReads(ctx context.Context) {
	if f, ok := ctx.Value(betweenReadsKey{}).(func()); ok && f != nil {
		f()
	}
}
