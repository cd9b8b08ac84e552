package store

import (
	"context"

	"github.com/capledger/capledger/ledger"
)

// Rollouts keeps the rollouts (ledger.Rollout): one row per rollout, its
// whole history included. A rollout changes a few times a day, by an
// operator, so a change is one small write of its own, not a command of a
// ledger batch; the server reads them all and applies ledger.RolloutModeFor
// to each reserve. Every driver implements it (memstore, SQLite,
// PostgreSQL) and store/storetest checks it.
type Rollouts interface {
	// RolloutList returns every rollout, ordered by name.
	RolloutList(ctx context.Context) ([]ledger.Rollout, error)
	// RolloutGet returns one rollout, or ErrNotFound.
	RolloutGet(ctx context.Context, name string) (ledger.Rollout, error)
	// RolloutPut writes r over the version it replaces: it inserts r when
	// r.Version is 1 (ErrDuplicate if the name exists), and otherwise
	// replaces the stored row only if that row's version is r.Version-1
	// (ErrConflict if it is not, or if the row is missing: somebody else
	// changed the rollout since it was read; read it again and redo the
	// step). Versions never go back, so a step is never lost to a
	// concurrent one.
	RolloutPut(ctx context.Context, r *ledger.Rollout) error
}
