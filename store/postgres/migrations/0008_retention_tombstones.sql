-- capledger schema version 6: retention of finished reservations.
--
-- Retention (ledger.Retire) deletes a terminal reservation row and leaves
-- a tombstone, which answers a late retry of the id until the tombstone
-- horizon (ledger.Forget) drops it too. retained keeps, per account, how
-- many reservations retention removed and the settled usage and overdraft
-- they carried, so the audit's spent and debt checks still add up.
CREATE TABLE IF NOT EXISTS tombstones (
    id             text     PRIMARY KEY,
    request_digest text     NOT NULL,
    subject        text     NOT NULL,
    route          text     NOT NULL,
    region         text     NOT NULL,
    generation     bigint   NOT NULL CHECK (generation >= 0),
    state          smallint NOT NULL CHECK (state IN (3, 4, 5, 7)),
    finished_at    bigint   NOT NULL
);
CREATE INDEX IF NOT EXISTS tombstones_finished ON tombstones (finished_at, id);

CREATE TABLE IF NOT EXISTS retained (
    subject      text     NOT NULL,
    route        text     NOT NULL,
    region       text     NOT NULL,
    generation   bigint   NOT NULL CHECK (generation >= 0),
    reservations bigint   NOT NULL CHECK (reservations >= 0),
    spent        bigint[] NOT NULL CHECK (cardinality(spent) = 4 AND 0 <= ALL (spent)),
    overdraft    bigint[] NOT NULL CHECK (cardinality(overdraft) = 4 AND 0 <= ALL (overdraft)),
    PRIMARY KEY (subject, route, region, generation)
);

-- ReservationsFinished reads only terminal rows (SETTLED,
-- SETTLED_WITH_DEBT, RELEASED, EXPIRED), in finish order. Migrations run
-- in one transaction, so this is a plain CREATE INDEX (it blocks writes to
-- reservations while it builds); on a large table build it beforehand with
-- CREATE INDEX CONCURRENTLY under this name, and this step does nothing.
CREATE INDEX IF NOT EXISTS reservations_finished ON reservations (finished_at, id) WHERE state IN (3, 4, 5, 7);
