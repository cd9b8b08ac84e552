-- capledger schema version 12: the accounts in debt, in key order.
--
-- Version 4's partial index finds the term rows in debt, but by account
-- id: AccountsInDebt had to read every debtor, fetch its account and sort
-- them all by key to return one page. accounts.in_debt says whether any
-- term row of the account owes (overdraft_issued > overdraft_repaid, the
-- rule of store.RowInDebt and of SQLite's account_debtors), and the
-- partial index accounts_in_debt holds the keys of those accounts only,
-- in the order pages are read (bytes, COLLATE "C", as Go compares keys
-- and as the SQLite store orders them): a page is one seek to the cursor
-- and as many entries as it returns.
--
-- Adding a column with a constant default rewrites no rows (PostgreSQL
-- 11 and later). The DO block adds it only when it is missing, so a
-- schema where the operator added it beforehand takes no ACCESS
-- EXCLUSIVE lock on accounts here (docs/OPERATIONS.md).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
            WHERE attrelid = 'accounts'::regclass AND attname = 'in_debt' AND NOT attisdropped) THEN
        ALTER TABLE accounts ADD COLUMN in_debt boolean NOT NULL DEFAULT false;
    END IF;
END
$$;

-- The flag follows the term rows in the database itself, so it cannot
-- disagree with them whoever writes them: this binary, a replica of an
-- older version during a rolling upgrade (it knows nothing of the
-- column), or an operator's SQL. The triggers fire only for a term row
-- that starts or stops owing (the WHEN clauses), so the commands of
-- accounts out of debt, nearly all of them, do not run the function; when
-- it runs it sets the flag from all the account's term rows (the primary
-- key's range for that account, at most four rows) and writes the
-- account row only when the flag changes. The writer already holds the
-- account row's lock (it updated the row earlier in the transaction), so
-- no concurrent writer can change the account's terms in between. The
-- function keeps the migration's search_path (the store's schema): it
-- names its tables unqualified, and an operator's session on another
-- search_path must still update this schema's accounts.
CREATE OR REPLACE FUNCTION account_terms_debt_changed() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    changed bigint;
BEGIN
    FOREACH changed IN ARRAY CASE TG_OP
            WHEN 'INSERT' THEN ARRAY[NEW.account_id]
            WHEN 'DELETE' THEN ARRAY[OLD.account_id]
            ELSE ARRAY[OLD.account_id, NEW.account_id] END LOOP
        UPDATE accounts a SET in_debt = d.owes
        FROM (SELECT EXISTS (SELECT 1 FROM account_terms t
                WHERE t.account_id = changed AND t.overdraft_issued > t.overdraft_repaid) AS owes) d
        WHERE a.id = changed AND a.in_debt <> d.owes;
    END LOOP;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS account_terms_debt_inserted ON account_terms;
CREATE TRIGGER account_terms_debt_inserted AFTER INSERT ON account_terms
    FOR EACH ROW WHEN (NEW.overdraft_issued > NEW.overdraft_repaid)
    EXECUTE FUNCTION account_terms_debt_changed();
DROP TRIGGER IF EXISTS account_terms_debt_updated ON account_terms;
CREATE TRIGGER account_terms_debt_updated AFTER UPDATE ON account_terms
    FOR EACH ROW WHEN ((OLD.overdraft_issued > OLD.overdraft_repaid) <> (NEW.overdraft_issued > NEW.overdraft_repaid)
        OR OLD.account_id <> NEW.account_id)
    EXECUTE FUNCTION account_terms_debt_changed();
DROP TRIGGER IF EXISTS account_terms_debt_deleted ON account_terms;
CREATE TRIGGER account_terms_debt_deleted AFTER DELETE ON account_terms
    FOR EACH ROW WHEN (OLD.overdraft_issued > OLD.overdraft_repaid)
    EXECUTE FUNCTION account_terms_debt_changed();

-- The backfill, after the triggers, so that no writer can change a term
-- row between it and them (CREATE TRIGGER holds a lock on account_terms
-- that blocks writes until the migration commits). Flags set without
-- debt are cleared first (only possible when the column was added
-- beforehand and written meanwhile by older replicas or by hand), then
-- the accounts with a term row in debt, found by version 4's index, are
-- set. Only accounts whose flag changes are written, and before the index
-- below exists, so those updates stay HOT (no index is written).
UPDATE accounts a SET in_debt = false
    WHERE a.in_debt AND NOT EXISTS (SELECT 1 FROM account_terms o
        WHERE o.account_id = a.id AND o.overdraft_issued > o.overdraft_repaid);
UPDATE accounts a SET in_debt = true
    WHERE NOT a.in_debt AND a.id IN (SELECT o.account_id FROM account_terms o
        WHERE o.overdraft_issued > o.overdraft_repaid);

-- Migrations run in one transaction, so this is a plain CREATE INDEX (not
-- CONCURRENTLY): building it reads the whole accounts table once and
-- blocks writes to it meanwhile. IF NOT EXISTS lets an operator with a
-- large table build it beforehand with CREATE INDEX CONCURRENTLY under
-- this name, once the column exists (docs/OPERATIONS.md).
CREATE INDEX IF NOT EXISTS accounts_in_debt
    ON accounts (subject COLLATE "C", route COLLATE "C", region COLLATE "C", generation) WHERE in_debt;
