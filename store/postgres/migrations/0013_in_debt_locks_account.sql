-- capledger schema version 13: the in_debt trigger locks the account row
-- before it reads the account's term rows.
--
-- Version 12's function read the terms and wrote the flag only when it
-- changed, so a writer that had not locked the account row first could
-- read a flag another transaction was about to change, find nothing to
-- write and not wait: session A repays dimension 0 (its trigger clears
-- the flag and holds the row), session B makes dimension 1 owe (its
-- trigger reads the committed flag, still set, and writes nothing), A
-- commits: the account owes with in_debt false, and no debt page lists
-- it. The store's own writers (this version's and older ones) lock the
-- account row before its terms, so only writes from outside the store,
-- such as an operator's SQL, could do this. Now the function locks the
-- row first (for the store's writers a lock they already hold), and the
-- statement after the lock reads the terms as committed once the lock is
-- granted (READ COMMITTED: a new snapshot per statement). Replacing a
-- function takes no lock on the tables.
CREATE OR REPLACE FUNCTION account_terms_debt_changed() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    changed bigint;
BEGIN
    FOREACH changed IN ARRAY CASE TG_OP
            WHEN 'INSERT' THEN ARRAY[NEW.account_id]
            WHEN 'DELETE' THEN ARRAY[OLD.account_id]
            ELSE ARRAY[OLD.account_id, NEW.account_id] END LOOP
        PERFORM 1 FROM accounts WHERE id = changed FOR NO KEY UPDATE;
        UPDATE accounts a SET in_debt = d.owes
        FROM (SELECT EXISTS (SELECT 1 FROM account_terms t
                WHERE t.account_id = changed AND t.overdraft_issued > t.overdraft_repaid) AS owes) d
        WHERE a.id = changed AND a.in_debt <> d.owes;
    END LOOP;
    RETURN NULL;
END
$$;
