package ledger

// MetaLeftBehind is metaLeftBehind for the tests of package ledger_test.
var MetaLeftBehind = metaLeftBehind
