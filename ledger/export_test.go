package ledger

// MetaLeftBehind is metaLeftBehind for the tests of package ledger_test.
var MetaLeftBehind = metaLeftBehind

// Streams is streams for the tests of package ledger_test.
var Streams = streams
