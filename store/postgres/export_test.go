package postgres

// Exported for the external tests of the query plans.
var (
	UnknownSQL        = unknownSQL
	UnknownBacklogSQL = unknownBacklogSQL
	DebtFirstSQL      = debtFirstSQL
	DebtAfterSQL      = debtAfterSQL
)
