-- capledger schema: the operator console's reads (store.ConsoleStore).
--
-- reservations_by_subject serves one subject's reservations by state,
-- newest first, and their count per state: a range of the index per
-- state. It is the one index here that the ledger's writes maintain (an
-- entry per reservation, moved when its state changes).
CREATE INDEX reservations_by_subject ON reservations (subject, state, created_at, id);

-- The USAGE_UNKNOWN resolver's last answer per reservation, written by
-- the worker leader, read by every replica. Times are Unix nanoseconds.
-- A row whose reservation left USAGE_UNKNOWN is stale: reads skip it and
-- the resolver prunes it after each pass over the backlog.
CREATE TABLE resolver_answers (
    reservation_id TEXT    PRIMARY KEY,
    answer         TEXT    NOT NULL,
    detail         TEXT    NOT NULL,
    asked_at       INTEGER NOT NULL,
    attempts       INTEGER NOT NULL,
    next_at        INTEGER NOT NULL
) WITHOUT ROWID;

-- The last audit and the last clean audit (name 'last' and 'last_clean');
-- checks is a JSON object of discrepancy counts by check.
CREATE TABLE audit_records (
    name          TEXT    PRIMARY KEY,
    at            INTEGER NOT NULL,
    by            TEXT    NOT NULL,
    mode          TEXT    NOT NULL,
    discrepancies INTEGER NOT NULL,
    checks        TEXT    NOT NULL
) WITHOUT ROWID;
