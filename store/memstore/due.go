package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// AccountsByEpoch returns copies of up to f.Limit accounts of generation
// f.Generation (of every one with f.AllGenerations, then ordered by
// generation last) with EpochStart <= f.StartedBy (any when it is zero),
// in (EpochStart, subject, route, region) order after f.After, and the
// last one's position. It filters every account and sorts the matches: the
// simulator's stores are small, and the SQL stores keep the index.
func (s *Store) AccountsByEpoch(ctx context.Context, f store.EpochFilter) (out []ledger.Account, _ store.EpochCursor, err error) {
	bound, after, err := epochRange(f)
	if err != nil {
		return nil, store.EpochCursor{}, fmt.Errorf("accounts by epoch: %w", err)
	}
	fromStart := f.After == (store.EpochCursor{})
	var list []*ledger.Account
	err = s.read(ctx, func(r *rows) error {
		for _, a := range r.accounts {
			if !f.AllGenerations && a.Key.Generation != f.Generation {
				continue
			}
			start := nanos(a.EpochStart)
			if !f.StartedBy.IsZero() && start > bound {
				continue
			}
			if !fromStart && compareEpoch(start, a.Key, after, f.After, f.AllGenerations) <= 0 {
				continue
			}
			list = append(list, a)
		}
		slices.SortFunc(list, func(x, y *ledger.Account) int {
			return compareEpoch(nanos(x.EpochStart), x.Key, nanos(y.EpochStart), store.EpochCursorOf(y), f.AllGenerations)
		})
		for _, a := range list[:min(f.Limit, len(list))] {
			out = append(out, *a)
		}
		return nil
	})
	if err != nil {
		return nil, store.EpochCursor{}, err
	}
	return out, store.LastEpochCursor(out), nil
}

// epochRange checks f and converts its bound and cursor time.
func epochRange(f store.EpochFilter) (bound, after int64, err error) {
	if err := store.CheckEpochFilter(f); err != nil {
		return 0, 0, err
	}
	var conv codec.Conv
	conv.Int(f.Generation)
	conv.Int(f.After.Generation)
	bound = conv.Nanos(f.StartedBy)
	after = conv.Nanos(f.After.EpochStart)
	return bound, after, conv.Err()
}

// EpochIndexCatchUp reads nothing: AccountsByEpoch orders by EpochStart
// itself, so no entry lags.
func (s *Store) EpochIndexCatchUp(ctx context.Context, f store.EpochFilter) (store.EpochCursor, bool, error) {
	if _, _, err := epochRange(f); err != nil {
		return store.EpochCursor{}, false, fmt.Errorf("epoch index catch-up: %w", err)
	}
	return store.EpochCursor{}, false, nil
}

// compareEpoch orders an account (its epoch start in nanoseconds and key)
// against a cursor position, as AccountsByEpoch orders them (with
// across, as it orders them across generations).
func compareEpoch(start int64, key ledger.AccountKey, cursorStart int64, c store.EpochCursor, across bool) int {
	if start != cursorStart {
		if start < cursorStart {
			return -1
		}
		return 1
	}
	if n := strings.Compare(key.Subject, c.Subject); n != 0 {
		return n
	}
	if n := strings.Compare(key.Route, c.Route); n != 0 {
		return n
	}
	if n := strings.Compare(key.Region, c.Region); n != 0 || !across {
		return n
	}
	return cmp.Compare(key.Generation, c.Generation)
}

// errLeaseArgs is the error for a lease call without a name, holder or
// positive ttl.
var errLeaseArgs = errors.New("lease: name, holder and a positive ttl are required")

// LeaseAcquire grants the lease to every holder: an in-memory store
// belongs to one process, which owns its leases (there is no other
// replica to keep out). It never expires.
func (s *Store) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return store.Lease{}, fmt.Errorf("%w (name %q, holder %q, ttl %v)", errLeaseArgs, name, holder, ttl)
	}
	if err := s.read(ctx, func(*rows) error { return nil }); err != nil {
		return store.Lease{}, err
	}
	return store.Lease{Name: name, Holder: holder, Held: true, Fence: 1}, nil
}

// LeaseRelease does nothing: the process keeps owning its leases.
func (s *Store) LeaseRelease(ctx context.Context, name, holder string) error {
	return s.read(ctx, func(*rows) error { return nil })
}
