package store

import "context"

type progressKey struct{}

// WithProgress returns ctx carrying progressed, which a reader of many
// pages (a scan of every account) calls after each page it read
// (Progressed), so that its caller can bound the wait for the next page
// instead of the whole scan: the server ends such a scan when its store
// has not answered a page for its store timeout (server/storecap.go).
func WithProgress(ctx context.Context, progressed func()) context.Context {
	return context.WithValue(ctx, progressKey{}, progressed)
}

// Progressed calls ctx's progress function (WithProgress), if it
// carries one.
func Progressed(ctx context.Context) {
	if progressed, ok := ctx.Value(progressKey{}).(func()); ok {
		progressed()
	}
}
