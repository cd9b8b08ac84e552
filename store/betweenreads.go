package store

import "context"

// betweenReadsKey is the context key of WithBetweenReads' hook.
type betweenReadsKey struct{}

// WithBetweenReads returns ctx carrying f, for tests: a driver's
// AccountsView (ReadAccountsView) calls f once between its reads (after
// the accounts, before the owing rows, heads and policies); the in-memory
// store, which reads them in one hold of its lock, calls it after. The
// engine's DrainProgress calls it in each pass between a generation's
// head and its accounts. A test commits in f to show that what is read
// stood together. Nothing but BetweenReads looks at the value.
func WithBetweenReads(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, betweenReadsKey{}, f)
}

// BetweenReads calls the hook WithBetweenReads put in ctx, if any.
func BetweenReads(ctx context.Context) {
	if f, ok := ctx.Value(betweenReadsKey{}).(func()); ok && f != nil {
		f()
	}
}
