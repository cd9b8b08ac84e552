-- capledger schema version 17: epoch statements indexed by epoch end.
--
-- serve --statement-retention removes the statements whose epoch ended
-- longer ago than it, the earliest ended first, a page a transaction
-- (StatementsRemove): this index finds them without reading the kept
-- ones. Building it reads every statement once. IF NOT EXISTS: a file
-- whose later versions were undone (tests of upgrades) runs it again.
CREATE INDEX IF NOT EXISTS statements_by_end ON statements (epoch_end);
