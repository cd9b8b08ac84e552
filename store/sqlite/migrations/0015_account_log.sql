-- capledger schema version 15 (experiment, branch sqlmem): account rows
-- written behind. A commit appends the accounts it wrote to account_log
-- (one row, packed) instead of updating their rows; the store flushes them
-- to accounts in key order later and deletes the log rows it covered.
CREATE TABLE account_log (
    seq      INTEGER PRIMARY KEY,
    accounts BLOB    NOT NULL
);
