-- capledger schema, version 1.
--
-- Every term of the conservation equation is its own column (one row per
-- account and dimension), so the database itself refuses a negative term or
-- a broken equation: a bug upstream fails the transaction instead of
-- storing a wrong balance. Times are Unix nanoseconds (0 = unset), the
-- convention of store/codec shared with the SQLite store, because
-- timestamptz keeps only microseconds and the ledger's times round-trip
-- exactly.

CREATE TABLE meta (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);

CREATE TABLE policies (
    generation       bigint PRIMARY KEY CHECK (generation > 0),
    subject          text   NOT NULL,
    route            text   NOT NULL,
    region           text   NOT NULL,
    dimensions       bytea  NOT NULL, -- codec.EncodeDimensions (JSON)
    estimator_digest text   NOT NULL,
    hold_ttl         bigint NOT NULL CHECK (hold_ttl >= 0),
    execution_limit  bigint NOT NULL CHECK (execution_limit >= 0),
    priority         bigint NOT NULL,
    fairness_weight  bigint NOT NULL,
    fairness_budget  double precision NOT NULL,
    emergency_mode   boolean NOT NULL,
    rollout          text   NOT NULL,
    epoch_length     bigint NOT NULL CHECK (epoch_length >= 0),
    published_at     bigint NOT NULL,
    rolled_back      boolean NOT NULL
);
CREATE INDEX policies_key ON policies (subject, route, region, generation);

CREATE TABLE policy_heads (
    subject text   NOT NULL,
    route   text   NOT NULL,
    region  text   NOT NULL,
    active  bigint NOT NULL CHECK (active >= 0),
    latest  bigint NOT NULL CHECK (latest >= 0),
    PRIMARY KEY (subject, route, region)
);

CREATE TABLE accounts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     text   NOT NULL,
    route       text   NOT NULL,
    region      text   NOT NULL,
    generation  bigint NOT NULL CHECK (generation >= 0),
    dims        smallint NOT NULL CHECK (dims BETWEEN 0 AND 4),
    epoch_start bigint NOT NULL,
    breaches    bigint NOT NULL CHECK (breaches >= 0),
    version     bigint NOT NULL CHECK (version >= 0),
    UNIQUE (subject, route, region, generation)
);

-- One row per account and dimension: the conservation terms, the epoch's
-- opening terms and the refill cursor.
CREATE TABLE account_terms (
    account_id            bigint   NOT NULL REFERENCES accounts (id),
    dim                   smallint NOT NULL CHECK (dim BETWEEN 0 AND 3),
    opening               bigint NOT NULL CHECK (opening >= 0),
    minted                bigint NOT NULL CHECK (minted >= 0),
    overdraft_issued      bigint NOT NULL CHECK (overdraft_issued >= 0),
    available             bigint NOT NULL CHECK (available >= 0),
    reserved              bigint NOT NULL CHECK (reserved >= 0),
    spent                 bigint NOT NULL CHECK (spent >= 0),
    retired_for_emergency bigint NOT NULL CHECK (retired_for_emergency >= 0),
    retired_for_move      bigint NOT NULL CHECK (retired_for_move >= 0),
    overdraft_repaid      bigint NOT NULL CHECK (overdraft_repaid >= 0),
    epoch_opening         bigint NOT NULL CHECK (epoch_opening >= 0),
    epoch_minted          bigint NOT NULL CHECK (epoch_minted >= 0),
    epoch_overdraft_issued bigint NOT NULL CHECK (epoch_overdraft_issued >= 0),
    epoch_available       bigint NOT NULL CHECK (epoch_available >= 0),
    epoch_reserved        bigint NOT NULL CHECK (epoch_reserved >= 0),
    epoch_spent           bigint NOT NULL CHECK (epoch_spent >= 0),
    epoch_retired_for_emergency bigint NOT NULL CHECK (epoch_retired_for_emergency >= 0),
    epoch_retired_for_move bigint NOT NULL CHECK (epoch_retired_for_move >= 0),
    epoch_overdraft_repaid bigint NOT NULL CHECK (epoch_overdraft_repaid >= 0),
    refilled_to           bigint NOT NULL,
    PRIMARY KEY (account_id, dim),
    CONSTRAINT account_terms_conserved CHECK (
        opening + minted + overdraft_issued =
        available + reserved + spent + retired_for_emergency + retired_for_move + overdraft_repaid),
    CONSTRAINT account_terms_repaid_le_issued CHECK (overdraft_repaid <= overdraft_issued)
);
-- A hot account's rows are rewritten by every batch: room on the page lets
-- PostgreSQL keep each new version on the same page (a HOT update, no index
-- write), and vacuum reclaims the old ones without index work.
ALTER TABLE accounts SET (fillfactor = 50);
ALTER TABLE account_terms SET (fillfactor = 50);

CREATE TABLE account_currents (
    subject    text   NOT NULL,
    route      text   NOT NULL,
    region     text   NOT NULL,
    generation bigint NOT NULL CHECK (generation >= 0),
    PRIMARY KEY (subject, route, region)
);

-- Amount vectors are bigint[4] (one entry per dimension) with real CHECKs.
-- Reservations, statements and journal rows name their account by key, not
-- by a foreign key: the store keeps rows, the ledger decides what refers to
-- what (and a reservation insert then takes no lock on the hot account row).
CREATE TABLE reservations (
    id                 text   PRIMARY KEY,
    request_digest     text   NOT NULL,
    subject            text   NOT NULL,
    route              text   NOT NULL,
    region             text   NOT NULL,
    generation         bigint NOT NULL CHECK (generation >= 0),
    accounting_epoch   bigint NOT NULL,
    reserved           bigint[] NOT NULL CHECK (cardinality(reserved) = 4 AND 0 <= ALL (reserved)),
    actual             bigint[] NOT NULL CHECK (cardinality(actual) = 4 AND 0 <= ALL (actual)),
    overdraft          bigint[] NOT NULL CHECK (cardinality(overdraft) = 4 AND 0 <= ALL (overdraft)),
    operation_id       text   NOT NULL,
    state              smallint NOT NULL CHECK (state BETWEEN 0 AND 8),
    created_at         bigint NOT NULL,
    expires_at         bigint NOT NULL,
    started_at         bigint NOT NULL,
    execution_deadline bigint NOT NULL,
    finished_at        bigint NOT NULL,
    breach             boolean NOT NULL,
    -- When a worker must look at the reservation (NULL: never): RESERVED
    -- at its expiry, EXPIRING at once, STARTED at its execution deadline.
    due_at bigint GENERATED ALWAYS AS (
        CASE
            WHEN state = 1 THEN expires_at
            WHEN state = 6 THEN expires_at
            WHEN state = 2 AND execution_deadline <> 0 THEN execution_deadline
        END) STORED
);
CREATE INDEX reservations_due ON reservations (due_at, id) WHERE due_at IS NOT NULL;

CREATE TABLE moves (
    receipt_id     text     PRIMARY KEY,
    kind           smallint NOT NULL CHECK (kind BETWEEN 0 AND 255),
    from_subject   text     NOT NULL,
    from_route     text     NOT NULL,
    from_region    text     NOT NULL,
    from_generation bigint  NOT NULL CHECK (from_generation >= 0),
    to_subject     text     NOT NULL,
    to_route       text     NOT NULL,
    to_region      text     NOT NULL,
    to_generation  bigint   NOT NULL CHECK (to_generation >= 0),
    units          bigint[] NOT NULL CHECK (cardinality(units) = 4 AND 0 <= ALL (units)),
    debt           bigint[] NOT NULL CHECK (cardinality(debt) = 4 AND 0 <= ALL (debt)),
    at             bigint   NOT NULL
);

CREATE TABLE shards (
    id          text   PRIMARY KEY,
    subject     text   NOT NULL,
    route       text   NOT NULL,
    region      text   NOT NULL,
    generation  bigint NOT NULL CHECK (generation >= 0),
    gateway_id  text   NOT NULL,
    boot_epoch  bigint NOT NULL CHECK (boot_epoch >= 0),
    fence       bigint NOT NULL CHECK (fence >= 0),
    allocated   bigint[] NOT NULL CHECK (cardinality(allocated) = 4 AND 0 <= ALL (allocated)),
    spent       bigint[] NOT NULL CHECK (cardinality(spent) = 4 AND 0 <= ALL (spent)),
    unknown     bigint[] NOT NULL CHECK (cardinality(unknown) = 4 AND 0 <= ALL (unknown)),
    reminted    bigint[] NOT NULL CHECK (cardinality(reminted) = 4 AND 0 <= ALL (reminted)),
    issued_at   bigint NOT NULL,
    expires_at  bigint NOT NULL,
    key_id      text   NOT NULL,
    signature   bytea  NOT NULL,
    reconciled  boolean NOT NULL
);

CREATE TABLE statements (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     text   NOT NULL,
    route       text   NOT NULL,
    region      text   NOT NULL,
    generation  bigint NOT NULL CHECK (generation >= 0),
    epoch_start bigint NOT NULL,
    epoch_end   bigint NOT NULL,
    dims        smallint NOT NULL CHECK (dims BETWEEN 0 AND 4),
    UNIQUE (subject, route, region, generation, epoch_start)
);

-- One row per statement, dimension and side (opening or closing). No
-- conservation CHECK here: a statement reports what the account held, and
-- the audit (not the store) judges it.
CREATE TABLE statement_terms (
    statement_id          bigint   NOT NULL REFERENCES statements (id),
    dim                   smallint NOT NULL CHECK (dim BETWEEN 0 AND 3),
    closing               boolean  NOT NULL,
    opening               bigint NOT NULL CHECK (opening >= 0),
    minted                bigint NOT NULL CHECK (minted >= 0),
    overdraft_issued      bigint NOT NULL CHECK (overdraft_issued >= 0),
    available             bigint NOT NULL CHECK (available >= 0),
    reserved              bigint NOT NULL CHECK (reserved >= 0),
    spent                 bigint NOT NULL CHECK (spent >= 0),
    retired_for_emergency bigint NOT NULL CHECK (retired_for_emergency >= 0),
    retired_for_move      bigint NOT NULL CHECK (retired_for_move >= 0),
    overdraft_repaid      bigint NOT NULL CHECK (overdraft_repaid >= 0),
    PRIMARY KEY (statement_id, dim, closing)
);

-- The journal: append-only, one row per command and account. Deltas may be
-- negative, so they are one codec.EncodeBalances value.
CREATE TABLE journal (
    seq            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject        text     NOT NULL,
    route          text     NOT NULL,
    region         text     NOT NULL,
    generation     bigint   NOT NULL CHECK (generation >= 0),
    at             bigint   NOT NULL,
    kind           smallint NOT NULL CHECK (kind BETWEEN 0 AND 255),
    reservation_id text     NOT NULL,
    from_state     smallint NOT NULL CHECK (from_state BETWEEN 0 AND 255),
    to_state       smallint NOT NULL CHECK (to_state BETWEEN 0 AND 255),
    receipt_id     text     NOT NULL,
    delta          bytea    NOT NULL
);
