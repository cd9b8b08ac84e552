-- EXPIRING reservations are due whatever their due_at. A partial index over
-- just them lets ReservationsDue find the few whose due_at is still ahead
-- without a range scan over every future hold (state 6 is
-- ledger.StateExpiring; the query names it as a literal so the planner can
-- match this index's predicate).
CREATE INDEX reservations_expiring ON reservations (due_at, id) WHERE state = 6;
