-- capledger schema: the operator console's reads (store.ConsoleStore).
--
-- reservations_by_subject serves one subject's reservations by state,
-- newest first, and their count per state: a range of the index per
-- state. id is compared in the "C" collation (bytes), the order Go uses
-- for the page cursor. Like 0006 this is a plain CREATE INDEX inside the
-- migration's transaction (it blocks writes to reservations while it is
-- built); an operator with a large table builds it beforehand with CREATE
-- INDEX CONCURRENTLY and the same definition and name.
CREATE INDEX IF NOT EXISTS reservations_by_subject ON reservations (subject, state, created_at, id COLLATE "C");

-- The USAGE_UNKNOWN resolver's last answer per reservation, written by
-- the worker leader, read by every replica. Times are Unix nanoseconds.
-- A row whose reservation left USAGE_UNKNOWN is stale: reads skip it and
-- the resolver prunes it after each pass over the backlog.
CREATE TABLE IF NOT EXISTS resolver_answers (
    reservation_id text   PRIMARY KEY,
    answer         text   NOT NULL,
    detail         text   NOT NULL,
    asked_at       bigint NOT NULL,
    attempts       bigint NOT NULL CHECK (attempts >= 0),
    next_at        bigint NOT NULL
);

-- The last audit and the last clean audit (name 'last' and 'last_clean');
-- checks holds the discrepancy counts by check.
CREATE TABLE IF NOT EXISTS audit_records (
    name          text   PRIMARY KEY CHECK (name IN ('last', 'last_clean')),
    at            bigint NOT NULL,
    by_name       text   NOT NULL,
    mode          text   NOT NULL,
    discrepancies bigint NOT NULL CHECK (discrepancies >= 0),
    checks        jsonb  NOT NULL
);
