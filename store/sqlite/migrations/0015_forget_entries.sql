-- capledger schema version 15: retention journals every tombstone it
-- forgets.
--
-- From this version on, a forget (and a retire past the tombstone
-- horizon, which leaves no tombstone) appends a journal entry of kind
-- forget, and the audit's refund_once check accepts a second life of a
-- reservation id only after one (ledger.Snapshot.ForgetsJournaledAfter).
-- Earlier versions forgot tombstones silently, so the position of the
-- last journal batch written before this version is kept: an id's
-- ending at or before it may have been forgotten unjournaled, and a
-- reuse after it is judged as before (taken for a reuse after the
-- horizon). A new file keeps 0: every ending needs its forget entry.
-- The rows of the old journal table (before version 3) are at position
-- 0, so at or before it in any file.
INSERT OR REPLACE INTO meta (name, value)
    SELECT 'forgets_journaled_after', COALESCE(MAX(seq), 0) FROM journal_batches;
