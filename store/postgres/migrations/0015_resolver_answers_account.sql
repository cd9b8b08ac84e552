-- capledger schema version 15: a resolver answer belongs to (account,
-- reservation id).
--
-- Reservation ids are the clients': once retention forgot a reservation,
-- another account may reserve under its id. Keyed by the id alone, an
-- answer about the first reservation (a settle refused because the id
-- was taken meanwhile, its backoff and attempt count) showed for the
-- second, and steered the resolver on it. Answers now live in
-- resolver_answers_by_account, keyed by the id and the account; reads and
-- the prune match both against the reservation the id names.
--
-- Expand-only: resolver_answers stays as it was, for replicas of an
-- earlier version during a rolling upgrade (their resolver goes on
-- writing it; this version neither reads nor writes it). Drop it once
-- every replica runs this version. Every row it holds now is copied. One
-- is given the account of the reservation its id names when that
-- reservation is USAGE_UNKNOWN and was marked so no later than the answer
-- was asked (the one the answer can be about); any other gets an empty
-- account, which no reservation has: it is never shown, and the
-- resolver's next prune deletes it, as it would have deleted it before.
CREATE TABLE IF NOT EXISTS resolver_answers_by_account (
    reservation_id text   NOT NULL,
    subject        text   NOT NULL,
    route          text   NOT NULL,
    region         text   NOT NULL,
    generation     bigint NOT NULL CHECK (generation >= 0),
    answer         text   NOT NULL,
    detail         text   NOT NULL,
    asked_at       bigint NOT NULL,
    attempts       bigint NOT NULL CHECK (attempts >= 0),
    next_at        bigint NOT NULL,
    PRIMARY KEY (reservation_id, subject, route, region, generation)
);

INSERT INTO resolver_answers_by_account
    SELECT a.reservation_id, COALESCE(r.subject, ''), COALESCE(r.route, ''), COALESCE(r.region, ''),
           COALESCE(r.generation, 0), a.answer, a.detail, a.asked_at, a.attempts, a.next_at
    FROM resolver_answers a
    LEFT JOIN reservations r ON r.id = a.reservation_id AND r.state = 8 AND r.unknown_at <= a.asked_at
    ON CONFLICT DO NOTHING;
