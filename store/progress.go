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

type waitsKey struct{}

// WithWaits returns ctx carrying waiting, which a long reader that
// alternates between asking its store for rows and working on them (an
// audit) calls with true when it asks the store (for the next row, page
// or read) and with false once the store answered and it works on the
// answer (Waits), so that its caller can bound each wait for the store
// and not the reader's own work between them: the server ends an audit
// when its store has not answered one read for its store timeout
// (server/storecap.go).
func WithWaits(ctx context.Context, waiting func(asking bool)) context.Context {
	return context.WithValue(ctx, waitsKey{}, waiting)
}

// Waits returns ctx's waiting function (WithWaits), or one that does
// nothing when ctx carries none.
func Waits(ctx context.Context) func(asking bool) {
	if waiting, ok := ctx.Value(waitsKey{}).(func(bool)); ok {
		return waiting
	}
	return func(bool) {}
}

// progressRows is how many rows of one long read pass between its reports
// of progress (RowRead).
const progressRows = 1024

// RowRead counts a row of one long read (rows: its count so far, this
// one included) and reports progress (Progressed) at its first row and
// after every progressRows of them, so a caller bounding each wait for its store
// waits anew while a table's rows keep arriving, not for the whole
// transfer of a large table (a full audit's moves or statements, which
// grow with the ledger's age).
func RowRead(ctx context.Context, rows int) {
	if rows == 1 || rows%progressRows == 0 {
		Progressed(ctx)
	}
}
