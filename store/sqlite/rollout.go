package sqlite

import (
	"context"
	"fmt"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.Rollouts = (*Store)(nil)

const (
	rolloutVersionSQL = "SELECT COALESCE((SELECT version FROM rollouts WHERE name = ?), 0)"
	rolloutInsertSQL  = "INSERT INTO rollouts (name, version, body) VALUES (?, ?, ?)"
	rolloutUpdateSQL  = "UPDATE rollouts SET version = ?, body = ? WHERE name = ? AND version = ?"
)

// RolloutList returns every rollout, ordered by name.
func (s *Store) RolloutList(ctx context.Context) (_ []ledger.Rollout, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	rows, err := s.readDB.QueryContext(ctx, "SELECT body FROM rollouts ORDER BY name")
	if err != nil {
		return nil, fmt.Errorf("rollout list: %w", translate(ctx, err))
	}
	defer rows.Close()
	var out []ledger.Rollout
	for rows.Next() {
		var body []byte
		if err := rows.Scan(&body); err != nil {
			return nil, fmt.Errorf("rollout list: %w", translate(ctx, err))
		}
		r, err := codec.DecodeRollout(body)
		if err != nil {
			return nil, fmt.Errorf("rollout list: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rollout list: %w", translate(ctx, err))
	}
	return out, nil
}

// RolloutGet returns one rollout, or store.ErrNotFound.
func (s *Store) RolloutGet(ctx context.Context, name string) (_ ledger.Rollout, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return ledger.Rollout{}, errClosed
	}
	var body []byte
	if err := s.readDB.QueryRowContext(ctx, "SELECT body FROM rollouts WHERE name = ?", name).Scan(&body); err != nil {
		return ledger.Rollout{}, fmt.Errorf("rollout %s: %w", name, translate(ctx, err))
	}
	r, err := codec.DecodeRollout(body)
	if err != nil {
		return ledger.Rollout{}, fmt.Errorf("rollout %s: %w", name, err)
	}
	return r, nil
}

// RolloutPut writes r over version r.Version-1 (see store.Rollouts), in a
// write transaction of its own.
func (s *Store) RolloutPut(ctx context.Context, r *ledger.Rollout) error {
	if r.Version == 0 {
		return fmt.Errorf("rollout %s: version 0 is never stored", r.Name)
	}
	body, err := codec.EncodeRollout(r)
	if err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, err)
	}
	t, err := s.Begin(ctx)
	if err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, err)
	}
	tx := t.(*Tx)
	defer tx.Rollback(ctx)
	exec := func(q string, args ...any) error {
		st, err := tx.w.stmt(stmtCtx(ctx), q)
		if err == nil {
			err = tx.w.exec(stmtCtx(ctx), st, args)
		}
		return tx.err(ctx, err)
	}
	st, err := tx.w.stmt(stmtCtx(ctx), rolloutVersionSQL)
	if err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, tx.err(ctx, err))
	}
	stored, err := queryOneRow(stmtCtx(ctx), tx.w, st, []any{r.Name}, scanInt)
	if err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, tx.err(ctx, err))
	}
	switch {
	case r.Version == 1 && stored != 0:
		return fmt.Errorf("rollout %s: %w", r.Name, store.ErrDuplicate)
	case r.Version == 1:
		err = exec(rolloutInsertSQL, r.Name, int64(r.Version), body)
	case uint64(stored) != r.Version-1:
		return fmt.Errorf("rollout %s: stored version %d, writing %d: %w", r.Name, stored, r.Version, store.ErrConflict)
	default:
		err = exec(rolloutUpdateSQL, int64(r.Version), body, r.Name, stored)
	}
	if err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, err)
	}
	return nil
}
