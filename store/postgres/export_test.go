package postgres

// Exported for the external tests of the query plans.
var (
	UnknownSQL        = unknownSQL
	UnknownBacklogSQL = unknownBacklogSQL
	DebtFirstSQL      = debtFirstSQL
	DebtAfterSQL      = debtAfterSQL
	DueSQL            = dueSQL
)

// SetAccountPage sets how many rows a page of an audit's account streams
// holds, and returns a function restoring it.
func SetAccountPage(n int) (restore func()) {
	old := accountPage
	accountPage = n
	return func() { accountPage = old }
}
