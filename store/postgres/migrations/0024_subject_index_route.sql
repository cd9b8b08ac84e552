-- capledger schema version 24: the subject index carries the route.
--
-- ListSubjectReservations' counts (ReservationStatesOfSubject) group a
-- subject's reservations by route and state. reservations_by_subject
-- (subject, state, created_at, id) holds no route, so the count read
-- every row of the subject from the table (docs/PERFORMANCE.md, "A
-- subject's reservation counts"). This index has the same keys and the
-- route as an included column: the count can be an index-only scan of
-- the subject's range (reading a table page only where the visibility
-- map says the page changed since the last vacuum), and a page of one
-- state is the same backwards range as before. It replaces
-- reservations_by_subject, so a write moves no more entries than
-- before (the route of a reservation never changes; a change of state
-- moved its entry already); each entry holds the route too.
-- Migrations run in one transaction, so this is a plain CREATE INDEX (it
-- blocks writes to reservations while it builds) and the DROP INDEX
-- waits for every transaction reading reservations; build the new index
-- beforehand with CREATE INDEX CONCURRENTLY under this name and drop the
-- old one with DROP INDEX CONCURRENTLY, and this step does nothing.
CREATE INDEX IF NOT EXISTS reservations_by_subject_route
    ON reservations (subject, state, created_at, id COLLATE "C") INCLUDE (route);
DROP INDEX IF EXISTS reservations_by_subject;
