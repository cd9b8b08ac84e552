-- capledger schema version 16: epoch statements indexed by epoch end.
--
-- serve --statement-retention removes the statements whose epoch ended
-- longer ago than it, the earliest ended first, a page a transaction
-- (StatementsRemove): this index finds them without reading the kept
-- ones. Building it reads every statement once and blocks writes to
-- statements meanwhile (a SHARE lock: epoch closes wait); to avoid that,
-- build it beforehand with CREATE INDEX CONCURRENTLY under this name.
CREATE INDEX IF NOT EXISTS statements_by_end ON statements (epoch_end, id);
