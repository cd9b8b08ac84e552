-- EXPIRING reservations are due whatever their due_at. A partial index over
-- just them lets ReservationsDue find the few that are not yet due by time
-- without walking every live reservation (state 6 is ledger.StateExpiring).
CREATE INDEX reservations_expiring ON reservations (due_at, id) WHERE state = 6;
