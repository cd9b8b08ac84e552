-- capledger schema version 23: the holds a subject's other generations
-- keep, counted on its current account.
--
-- accounts.held_elsewhere is ledger.Account.HeldElsewhere, encoded as the
-- other amounts are (store/codec), NULL when it counts nothing: what the
-- subject's accounts that are not current hold reserved, per dimension of
-- the current one, which its refill leaves room for. A row written before
-- this version reads NULL, 0 in every dimension. The Go step of this
-- version (addHeldElsewhere) adds the column, unless the table has it.
SELECT 1;
