package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.Rollouts = (*Store)(nil)

// RolloutList returns every rollout, ordered by name.
func (s *Store) RolloutList(ctx context.Context) ([]ledger.Rollout, error) {
	rows, err := s.pool.Query(ctx, `SELECT body FROM rollouts ORDER BY name`)
	if err != nil {
		return nil, s.c.classify("rollout list", err, false)
	}
	defer rows.Close()
	var out []ledger.Rollout
	for rows.Next() {
		var body []byte
		if err := rows.Scan(&body); err != nil {
			return nil, s.c.classify("rollout list", err, false)
		}
		r, err := codec.DecodeRollout(body)
		if err != nil {
			return nil, fmt.Errorf("rollout list: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.c.classify("rollout list", err, false)
	}
	return out, nil
}

// RolloutGet returns one rollout, or store.ErrNotFound.
func (s *Store) RolloutGet(ctx context.Context, name string) (ledger.Rollout, error) {
	var body []byte
	err := s.pool.QueryRow(ctx, `SELECT body FROM rollouts WHERE name = $1`, name).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Rollout{}, fmt.Errorf("rollout %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return ledger.Rollout{}, s.c.classify("rollout "+name, err, false)
	}
	r, err := codec.DecodeRollout(body)
	if err != nil {
		return ledger.Rollout{}, fmt.Errorf("rollout %s: %w", name, err)
	}
	return r, nil
}

// RolloutPut writes r over version r.Version-1 (see store.Rollouts): one
// statement, so two replicas stepping the same rollout at once cannot both
// win.
func (s *Store) RolloutPut(ctx context.Context, r *ledger.Rollout) error {
	if r.Version == 0 {
		return fmt.Errorf("rollout %s: version 0 is never stored", r.Name)
	}
	body, err := codec.EncodeRollout(r)
	if err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, err)
	}
	if r.Version == 1 {
		tag, err := s.pool.Exec(ctx, `INSERT INTO rollouts (name, version, body) VALUES ($1, 1, $2) ON CONFLICT (name) DO NOTHING`, r.Name, body)
		if err != nil {
			return s.c.classify("rollout "+r.Name, err, true)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("rollout %s: %w", r.Name, store.ErrDuplicate)
		}
		return nil
	}
	tag, err := s.pool.Exec(ctx, `UPDATE rollouts SET version = $1, body = $2 WHERE name = $3 AND version = $4`,
		int64(r.Version), body, r.Name, int64(r.Version-1))
	if err != nil {
		return s.c.classify("rollout "+r.Name, err, true)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("rollout %s: not at version %d: %w", r.Name, r.Version-1, store.ErrConflict)
	}
	return nil
}
