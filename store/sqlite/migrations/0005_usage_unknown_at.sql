-- capledger schema version 5: when a reservation was marked USAGE_UNKNOWN.
--
-- unknown_at is ledger.Reservation.UnknownAt in Unix nanoseconds, like
-- every time column; 0 means never marked. The USAGE_UNKNOWN backlog is
-- ordered and aged by it, not by started_at: work that ran 20 minutes
-- before its gateway gave up has waited for a receipt only since then.
ALTER TABLE reservations ADD COLUMN unknown_at INTEGER NOT NULL DEFAULT 0;

-- Rows marked before this version never recorded the time. Their start is
-- the best lower bound these old rows allow (a reservation is marked
-- after it starts), so they count from it: they look older than they
-- are, never younger. State 8 is ledger.StateUsageUnknown.
UPDATE reservations SET unknown_at = started_at WHERE state = 8;

-- The partial index of version 4 ordered the backlog by started_at; this
-- one replaces it and orders it as ReservationsUnknown now reads it:
-- unknown_at, then id. (The same name as PostgreSQL's, where the new name
-- keeps an index built beforehand apart from the old one.) Queries must
-- name the state as the literal 8 for SQLite to use it.
DROP INDEX reservations_usage_unknown;
CREATE INDEX reservations_usage_unknown_at ON reservations (unknown_at, id) WHERE state = 8;
