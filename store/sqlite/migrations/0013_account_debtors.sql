-- capledger schema version 13: the accounts whose row owes debt, by key.
--
-- Balances are an encoded BLOB, so no index over accounts can tell a
-- debtor, and AccountsInDebt read every account after its cursor until it
-- found a page: over a million tenants with a handful in debt, the whole
-- table on each call. account_debtors holds the key of every account whose
-- stored row owes (store.RowInDebt); the transaction that writes an
-- account adds or removes its key (accountwrite.go), and AccountsInDebt
-- reads these keys in order and only their accounts. An account admits
-- nothing while it owes, so the table stays small, and a command on an
-- account that neither owed nor owes does not write it. The rows already
-- in debt are added by the Go step of this version (fillAccountDebtors,
-- migrate), in the same transaction: SQL cannot decode the balances.
CREATE TABLE account_debtors (
    subject    TEXT    NOT NULL,
    route      TEXT    NOT NULL,
    region     TEXT    NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (subject, route, region, generation)
) WITHOUT ROWID;
