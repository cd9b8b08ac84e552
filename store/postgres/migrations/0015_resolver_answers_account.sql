-- capledger schema version 15: a resolver answer belongs to (account,
-- reservation id).
--
-- Reservation ids are the clients': once retention forgot a reservation,
-- another account may reserve under its id. Keyed by the id alone, an
-- answer about the first reservation (a settle refused because the id
-- was taken meanwhile, its backoff and attempt count) showed for the
-- second, and steered the resolver on it. Answers are now keyed by the
-- id and the account; reads and the prune match both against the
-- reservation the id names.
--
-- Every existing row is kept. One is given the account of the
-- reservation its id names when that reservation is USAGE_UNKNOWN and was
-- marked so no later than the answer was asked (the one the answer can be
-- about); any other keeps an empty account, which no reservation has:
-- it is never shown, and the resolver's next prune deletes it, as it
-- would have deleted it before. The table is small (one row per
-- USAGE_UNKNOWN reservation asked about) and only the resolver writes
-- it. A replica of an earlier version still running after this
-- migration cannot record answers (its upsert names the old key, and
-- fails; its resolver logs it) until it is upgraded.
ALTER TABLE resolver_answers
    ADD COLUMN IF NOT EXISTS subject    text   NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS route      text   NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS region     text   NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0);

UPDATE resolver_answers a
    SET subject = r.subject, route = r.route, region = r.region, generation = r.generation
    FROM reservations r
    WHERE r.id = a.reservation_id AND r.state = 8 AND r.unknown_at <= a.asked_at AND a.subject = '';

-- From here on every answer is written with its account.
ALTER TABLE resolver_answers
    ALTER COLUMN subject DROP DEFAULT,
    ALTER COLUMN route DROP DEFAULT,
    ALTER COLUMN region DROP DEFAULT,
    ALTER COLUMN generation DROP DEFAULT,
    DROP CONSTRAINT IF EXISTS resolver_answers_pkey,
    ADD CONSTRAINT resolver_answers_pkey PRIMARY KEY (reservation_id, subject, route, region, generation);
