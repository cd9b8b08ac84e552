-- capledger schema version 24: the holds outstanding at the upgrade,
-- counted.
--
-- Version 23 added accounts.held_elsewhere and rewrote no rows, so holds
-- a subject's superseded generations kept when the store was upgraded
-- were not counted on its current account until they ended. The Go step
-- of this version (countHeldElsewhere) sets every current account's count
-- from the holds of the subject's other accounts (ledger.HeldElsewhereOf)
-- and clears it on every other account.
SELECT 1;
