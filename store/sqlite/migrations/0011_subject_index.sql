-- capledger schema: the console's subject index without the state.
--
-- Version 10's reservations_by_subject (subject, state, created_at, id)
-- moved a reservation's entry at every step of its lifecycle (reserve,
-- start, settle each change the state): at the store that cost 1.33x the
-- CPU of a lifecycle without the index. This one holds what never changes
-- after the reserve, so the lifecycle's UPDATE (which names none of its
-- columns) leaves it alone: an entry is written once, at the insert, and
-- removed with the row. A subject's reservations are one range of it,
-- newest first; the state is read from the row (the console's page asks
-- for some states, the row is read anyway). Counting by state reads the
-- subject's rows, as counting by route did already.
DROP INDEX reservations_by_subject;
CREATE INDEX reservations_by_subject ON reservations (subject, created_at, id);
