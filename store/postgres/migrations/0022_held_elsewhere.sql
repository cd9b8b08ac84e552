-- capledger schema version 22: the holds a subject's other generations
-- keep, counted on its current account.
--
-- held_elsewhere is ledger.Account.HeldElsewhere, one value per dimension
-- row: what the subject's accounts that are not current hold reserved in
-- the dimension's unit, which the current account's refill leaves room
-- for. It is 0 on every account that is not current, and on every row
-- written before this version. Adding a column with a constant default
-- rewrites no rows (PostgreSQL 11 and later).
ALTER TABLE account_terms ADD COLUMN IF NOT EXISTS held_elsewhere bigint NOT NULL DEFAULT 0;
