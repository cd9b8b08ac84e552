-- capledger schema version 14: retention journals every tombstone it
-- forgets.
--
-- From this version on, a forget (and a retire past the tombstone
-- horizon, which leaves no tombstone) appends a journal entry of kind
-- forget, and the audit's refund_once check accepts a second life of a
-- reservation id only after one (ledger.Snapshot.ForgetsJournaledAfter).
-- Earlier versions forgot tombstones silently, so the greatest journal
-- seq handed out before this version is kept: an id's ending at or
-- before it may have been forgotten unjournaled, and a reuse after it is
-- judged as before (taken for a reuse after the horizon). A new schema
-- keeps 0: every ending needs its forget entry. A replica of an earlier
-- version still running after this migration forgets silently:
-- OPERATIONS.md says to upgrade every replica within the tombstone
-- horizon.
INSERT INTO meta (name, value)
    SELECT 'forgets_journaled_after', COALESCE(MAX(seq), 0) FROM journal
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
