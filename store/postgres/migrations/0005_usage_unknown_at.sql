-- capledger schema version 5: when a reservation was marked USAGE_UNKNOWN.
--
-- unknown_at is ledger.Reservation.UnknownAt in Unix nanoseconds, like
-- every time column; 0 means never marked. The USAGE_UNKNOWN backlog is
-- ordered and aged by it, not by started_at: work that ran 20 minutes
-- before its gateway gave up has waited for a receipt only since then.
-- Adding a column with a constant default rewrites no rows (PostgreSQL 11
-- and later).
ALTER TABLE reservations ADD COLUMN IF NOT EXISTS unknown_at bigint NOT NULL DEFAULT 0;

-- During a rolling upgrade, replicas of an older version keep running
-- after this migration, and their writes leave unknown_at at its default:
-- a reservation they mark USAGE_UNKNOWN would read as marked at the Unix
-- epoch (sorted first, aged by decades) until settled. This trigger gives
-- such a row its start instead, as the backfill below does for old rows.
-- This binary always writes unknown_at when it marks, so the trigger
-- never changes its rows; the WHEN clause keeps it from even running the
-- function for them. A later release can drop it, once no older binary
-- writes to this schema.
CREATE OR REPLACE FUNCTION reservations_unknown_at_default() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.unknown_at := NEW.started_at;
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS reservations_unknown_at_default ON reservations;
CREATE TRIGGER reservations_unknown_at_default BEFORE INSERT OR UPDATE ON reservations
    FOR EACH ROW WHEN (NEW.state = 8 AND NEW.unknown_at = 0)
    EXECUTE FUNCTION reservations_unknown_at_default();

-- Rows marked before this version never recorded the time. Their start is
-- the best lower bound these old rows allow (a reservation is marked
-- after it starts), so they count from it: they look older than they
-- are, never younger. State 8 is ledger.StateUsageUnknown; the partial
-- index of version 3 finds these rows, and "unknown_at = 0" keeps a
-- second run from touching them again.
UPDATE reservations SET unknown_at = started_at WHERE state = 8 AND unknown_at = 0;

-- The partial index of version 3 ordered the backlog by started_at; this
-- one orders it as ReservationsUnknown now reads it: unknown_at, then id.
-- Queries name the state as the literal 8 so the planner can match this
-- predicate.
--
-- Migrations run in one transaction, so this is a plain CREATE INDEX (not
-- CONCURRENTLY): building it reads the whole reservations table once and
-- blocks writes to it meanwhile. IF NOT EXISTS lets an operator with a
-- large table build it beforehand with CREATE INDEX CONCURRENTLY under
-- this name, once the column exists (docs/OPERATIONS.md, Schema
-- migrations). It has a new name, so that an index built beforehand is
-- not mistaken for version 3's on started_at.
DROP INDEX IF EXISTS reservations_usage_unknown;
CREATE INDEX IF NOT EXISTS reservations_usage_unknown_at ON reservations (unknown_at, id) WHERE state = 8;
