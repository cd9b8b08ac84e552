-- capledger schema version 6: retention of finished reservations.
--
-- Retention (ledger.Retire) deletes a terminal reservation row and leaves
-- a tombstone, which answers a late retry of the id until the tombstone
-- horizon (ledger.Forget) drops it too. retained keeps, per account, how
-- many reservations retention removed and the settled usage and overdraft
-- they carried, so the audit's spent and debt checks still add up.

CREATE TABLE tombstones (
    id             TEXT    PRIMARY KEY,
    request_digest TEXT    NOT NULL,
    subject        TEXT    NOT NULL,
    route          TEXT    NOT NULL,
    region         TEXT    NOT NULL,
    generation     INTEGER NOT NULL,
    state          INTEGER NOT NULL,
    finished_at    INTEGER NOT NULL
) WITHOUT ROWID;

-- TombstonesDue reads the tombstones in finish order.
CREATE INDEX tombstones_finished ON tombstones (finished_at, id);

CREATE TABLE retained (
    subject      TEXT    NOT NULL,
    route        TEXT    NOT NULL,
    region       TEXT    NOT NULL,
    generation   INTEGER NOT NULL,
    reservations INTEGER NOT NULL,
    spent        BLOB    NOT NULL,
    overdraft    BLOB    NOT NULL,
    PRIMARY KEY (subject, route, region, generation)
) WITHOUT ROWID;

-- ReservationsFinished reads only terminal rows, in finish order. States
-- 3, 4, 5 and 7 are SETTLED, SETTLED_WITH_DEBT, RELEASED and EXPIRED;
-- queries must name them as these literals for SQLite to use the index.
CREATE INDEX reservations_finished ON reservations (finished_at, id) WHERE state IN (3, 4, 5, 7);
