-- EXPIRING reservations are due whatever their due_at. A partial index over
-- just them lets ReservationsDue find the few whose due_at is still ahead
-- without a range scan over every future hold (state 6 is
-- ledger.StateExpiring; the query names it as a literal so the planner can
-- match this index's predicate). Migrations run in one transaction, so
-- this is a plain CREATE INDEX (it blocks writes to reservations while it
-- builds); an operator with a large table builds it beforehand with
-- CREATE INDEX CONCURRENTLY under this name, and this step does nothing.
CREATE INDEX IF NOT EXISTS reservations_expiring ON reservations (due_at, id) WHERE state = 6;
