-- capledger schema version 16: a resolver answer belongs to (account,
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
-- would have deleted it before.
CREATE TABLE resolver_answers_by_account (
    reservation_id TEXT    NOT NULL,
    subject        TEXT    NOT NULL,
    route          TEXT    NOT NULL,
    region         TEXT    NOT NULL,
    generation     INTEGER NOT NULL,
    answer         TEXT    NOT NULL,
    detail         TEXT    NOT NULL,
    asked_at       INTEGER NOT NULL,
    attempts       INTEGER NOT NULL,
    next_at        INTEGER NOT NULL,
    PRIMARY KEY (reservation_id, subject, route, region, generation)
) WITHOUT ROWID;

INSERT INTO resolver_answers_by_account
    SELECT a.reservation_id, COALESCE(r.subject, ''), COALESCE(r.route, ''), COALESCE(r.region, ''),
           COALESCE(r.generation, 0), a.answer, a.detail, a.asked_at, a.attempts, a.next_at
    FROM resolver_answers a
    LEFT JOIN reservations r ON r.id = a.reservation_id AND r.state = 8 AND r.unknown_at <= a.asked_at;

DROP TABLE resolver_answers;
ALTER TABLE resolver_answers_by_account RENAME TO resolver_answers;
