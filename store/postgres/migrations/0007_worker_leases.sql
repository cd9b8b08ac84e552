-- capledger schema: worker leases (one worker leader per store).
--
-- One row per lease name. A replica holds the lease while expires_at is
-- in the future at the database's clock (clock_timestamp(), so replicas'
-- clocks need not agree); it renews it well before then, and another
-- replica takes it over once it has lapsed. fence counts the changes of
-- holder. The engine's workers run only on the holder of the "workers"
-- lease; their commands are idempotent ledger commands, so a lease that
-- two replicas believe they hold for a moment costs duplicate no-ops,
-- never a double effect.
CREATE TABLE IF NOT EXISTS leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL CHECK (fence > 0),
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
