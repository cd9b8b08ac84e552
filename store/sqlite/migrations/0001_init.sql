-- capledger schema version 1.
--
-- Conventions (shared with the PostgreSQL store through store/codec):
-- times are Unix nanoseconds in INTEGER columns (0 = no time), uint64
-- counters are INTEGER (at most 2^63-1), vectors of amounts and balances are
-- codec's compact binary BLOBs, policy dimensions codec's JSON.
--
-- Tables keyed by text are WITHOUT ROWID: the primary key is the table's
-- b-tree, so a point read is one lookup and the key is stored once.
-- No FOREIGN KEY constraints: relations between rows are the ledger's to
-- keep and the audit's to check; the store keeps rows.

CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE policies (
    generation         INTEGER PRIMARY KEY,
    subject            TEXT    NOT NULL,
    route              TEXT    NOT NULL,
    region             TEXT    NOT NULL,
    dimensions         BLOB    NOT NULL,
    estimator_digest   TEXT    NOT NULL,
    hold_ttl_ns        INTEGER NOT NULL,
    execution_limit_ns INTEGER NOT NULL,
    priority           INTEGER NOT NULL,
    fairness_weight    INTEGER NOT NULL,
    fairness_budget    REAL    NOT NULL,
    emergency_mode     INTEGER NOT NULL,
    rollout            TEXT    NOT NULL,
    epoch_length_ns    INTEGER NOT NULL,
    published_at       INTEGER NOT NULL,
    rolled_back        INTEGER NOT NULL
);

CREATE TABLE policy_heads (
    subject TEXT    NOT NULL,
    route   TEXT    NOT NULL,
    region  TEXT    NOT NULL,
    active  INTEGER NOT NULL,
    latest  INTEGER NOT NULL,
    PRIMARY KEY (subject, route, region)
) WITHOUT ROWID;

-- The primary key serves AccountList both ways: a subject's generations
-- are a key-prefix range in generation order, and a full scan is in key
-- order.
CREATE TABLE accounts (
    subject       TEXT    NOT NULL,
    route         TEXT    NOT NULL,
    region        TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    dims          INTEGER NOT NULL,
    balances      BLOB    NOT NULL,
    epoch_start   INTEGER NOT NULL,
    epoch_opening BLOB    NOT NULL,
    refilled_to   BLOB    NOT NULL,
    breaches      INTEGER NOT NULL,
    version       INTEGER NOT NULL,
    PRIMARY KEY (subject, route, region, generation)
) WITHOUT ROWID;

CREATE TABLE account_currents (
    subject    TEXT    NOT NULL,
    route      TEXT    NOT NULL,
    region     TEXT    NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (subject, route, region)
) WITHOUT ROWID;

-- due_at is derived on write: when the reservation became due for a worker
-- (expires_at for RESERVED and EXPIRING, execution_deadline for STARTED
-- with a deadline), NULL for every other row. The partial index holds only
-- live rows, in the order ReservationsDue returns them.
CREATE TABLE reservations (
    id                 TEXT    PRIMARY KEY,
    request_digest     TEXT    NOT NULL,
    subject            TEXT    NOT NULL,
    route              TEXT    NOT NULL,
    region             TEXT    NOT NULL,
    generation         INTEGER NOT NULL,
    accounting_epoch   INTEGER NOT NULL,
    reserved           BLOB    NOT NULL,
    actual             BLOB    NOT NULL,
    overdraft          BLOB    NOT NULL,
    operation_id       TEXT    NOT NULL,
    state              INTEGER NOT NULL,
    created_at         INTEGER NOT NULL,
    expires_at         INTEGER NOT NULL,
    started_at         INTEGER NOT NULL,
    execution_deadline INTEGER NOT NULL,
    finished_at        INTEGER NOT NULL,
    breach             INTEGER NOT NULL,
    due_at             INTEGER
) WITHOUT ROWID;

CREATE INDEX reservations_due ON reservations (due_at, id) WHERE due_at IS NOT NULL;

CREATE TABLE moves (
    receipt_id      TEXT    PRIMARY KEY,
    kind            INTEGER NOT NULL,
    from_subject    TEXT    NOT NULL,
    from_route      TEXT    NOT NULL,
    from_region     TEXT    NOT NULL,
    from_generation INTEGER NOT NULL,
    to_subject      TEXT    NOT NULL,
    to_route        TEXT    NOT NULL,
    to_region       TEXT    NOT NULL,
    to_generation   INTEGER NOT NULL,
    units           BLOB    NOT NULL,
    debt            BLOB    NOT NULL,
    at              INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE shards (
    id          TEXT    PRIMARY KEY,
    subject     TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    region      TEXT    NOT NULL,
    generation  INTEGER NOT NULL,
    gateway_id  TEXT    NOT NULL,
    boot_epoch  INTEGER NOT NULL,
    fence       INTEGER NOT NULL,
    amounts     BLOB    NOT NULL,
    issued_at   INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    key_id      TEXT    NOT NULL,
    signature   BLOB    NOT NULL,
    reconciled  INTEGER NOT NULL
) WITHOUT ROWID;

-- seq is the rowid: insertion order, which Snapshot returns.
CREATE TABLE statements (
    seq         INTEGER PRIMARY KEY,
    subject     TEXT    NOT NULL,
    route       TEXT    NOT NULL,
    region      TEXT    NOT NULL,
    generation  INTEGER NOT NULL,
    epoch_start INTEGER NOT NULL,
    epoch_end   INTEGER NOT NULL,
    dims        INTEGER NOT NULL,
    opening     BLOB    NOT NULL,
    closing     BLOB    NOT NULL,
    UNIQUE (subject, route, region, generation, epoch_start)
);

CREATE TABLE journal (
    seq            INTEGER PRIMARY KEY,
    at             INTEGER NOT NULL,
    kind           INTEGER NOT NULL,
    subject        TEXT    NOT NULL,
    route          TEXT    NOT NULL,
    region         TEXT    NOT NULL,
    generation     INTEGER NOT NULL,
    reservation_id TEXT    NOT NULL,
    from_state     INTEGER NOT NULL,
    to_state       INTEGER NOT NULL,
    receipt_id     TEXT    NOT NULL,
    delta          BLOB    NOT NULL
);
