-- capledger schema version 14: the epoch index follows a column only the
-- epoch worker advances.
--
-- accounts_by_epoch was on (generation, epoch_start), so every write that
-- rolled an account's epoch moved its index entry: when a busy account's
-- epoch ends, its next command closes it inline on the committer and
-- wrote a random page of the index besides the table's (during a
-- rollover of many accounts, a large share of the extra commit work).
-- The index is now on epoch_indexed, at most epoch_start: the write that
-- rolls a busy account's epoch leaves it where it was, so its entry
-- stays and no index page is written; the epoch worker's pass, which
-- reads the index in order, later sets epoch_indexed = epoch_start for
-- the entries it finds behind (EpochIndexCatchUp), in index order, a
-- chunk a transaction. The invariant epoch_indexed <= epoch_start means
-- the index never hides an account whose epoch ended: a lagging entry
-- sorts early and only costs a reader a row it filters out
-- (AccountsByEpoch returns rows whose epoch_start is within its bound).
-- A new account, a blind write and the roll of an idle account set
-- epoch_indexed = epoch_start as before (accountwrite.go says why).
DROP INDEX IF EXISTS accounts_by_epoch;
ALTER TABLE accounts ADD COLUMN epoch_indexed INTEGER NOT NULL DEFAULT 0;
UPDATE accounts SET epoch_indexed = epoch_start;
CREATE INDEX accounts_by_epoch ON accounts (generation, epoch_indexed);
