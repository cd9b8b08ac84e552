package memstore

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.Rollouts = (*Store)(nil)

// RolloutList returns every rollout, ordered by name.
func (s *Store) RolloutList(ctx context.Context) (out []ledger.Rollout, err error) {
	err = s.read(ctx, func(r *rows) error {
		for _, name := range slices.Sorted(maps.Keys(r.rollouts)) {
			ro, err := codec.DecodeRollout(r.rollouts[name])
			if err != nil {
				return fmt.Errorf("rollout %s: %w", name, err)
			}
			out = append(out, ro)
		}
		return nil
	})
	return out, err
}

// RolloutGet returns one rollout, or store.ErrNotFound.
func (s *Store) RolloutGet(ctx context.Context, name string) (out ledger.Rollout, err error) {
	err = s.read(ctx, func(r *rows) error {
		body, ok := r.rollouts[name]
		if !ok {
			return notFound("rollout", name)
		}
		out, err = codec.DecodeRollout(body)
		return err
	})
	return out, err
}

// RolloutPut writes r over version r.Version-1 (see store.Rollouts).
func (s *Store) RolloutPut(ctx context.Context, r *ledger.Rollout) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	body, err := codec.EncodeRollout(r)
	if err != nil {
		return fmt.Errorf("rollout %s: %w", r.Name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	rows := s.committed
	s.beforeApply(false) // durable at once, as the SQL stores' are
	old, exists := rows.rollouts[r.Name]
	switch {
	case r.Version == 0:
		return fmt.Errorf("rollout %s: version 0 is never stored", r.Name)
	case r.Version == 1 && exists:
		return fmt.Errorf("rollout %s: %w", r.Name, store.ErrDuplicate)
	case r.Version > 1:
		if !exists {
			return fmt.Errorf("rollout %s: not stored, cannot write version %d: %w", r.Name, r.Version, store.ErrConflict)
		}
		prev, err := codec.DecodeRollout(old)
		if err != nil {
			return fmt.Errorf("rollout %s: %w", r.Name, err)
		}
		if prev.Version != r.Version-1 {
			return fmt.Errorf("rollout %s: stored version %d, writing %d: %w", r.Name, prev.Version, r.Version, store.ErrConflict)
		}
	}
	rows.rollouts[r.Name] = body
	return nil
}
