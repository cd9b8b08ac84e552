package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capledger/capledger/store"
	"github.com/jackc/pgx/v5"
)

// leaseAcquireSQL takes lease $1 for holder $2 for $3 microseconds, in one
// statement: a new row, a renewal by the holder (same fence), or a
// takeover of a lapsed lease (fence + 1). It returns nothing when another
// holder's lease is still unexpired. Expiry is at the database's clock.
const leaseAcquireSQL = `INSERT INTO leases AS l (name, holder, fence, acquired_at, expires_at)
	VALUES ($1, $2, 1, clock_timestamp(), clock_timestamp() + $3 * interval '1 microsecond')
	ON CONFLICT (name) DO UPDATE SET
		holder = EXCLUDED.holder,
		fence = CASE WHEN l.holder = EXCLUDED.holder THEN l.fence ELSE l.fence + 1 END,
		acquired_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
		expires_at = EXCLUDED.expires_at
	WHERE l.holder = EXCLUDED.holder OR l.expires_at <= clock_timestamp()
	RETURNING holder, fence, expires_at`

// LeaseAcquire takes or renews the lease name for holder for ttl (rounded
// up to a microsecond) at the database's clock. Held is false, with the
// holder and expiry of the lease that stands, when another holder's lease
// has not lapsed.
func (s *Store) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return store.Lease{}, fmt.Errorf("lease: name, holder and a positive ttl are required (name %q, holder %q, ttl %v)", name, holder, ttl)
	}
	micros := (ttl + time.Microsecond - 1) / time.Microsecond
	lease := store.Lease{Name: name}
	err := s.pool.QueryRow(ctx, leaseAcquireSQL, name, holder, int64(micros)).Scan(&lease.Holder, &lease.Fence, &lease.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		err = s.pool.QueryRow(ctx, `SELECT holder, fence, expires_at FROM leases WHERE name = $1`, name).
			Scan(&lease.Holder, &lease.Fence, &lease.Expires)
		if errors.Is(err, pgx.ErrNoRows) {
			// Released and deleted between the two statements: not ours.
			return lease, nil
		}
	}
	if err != nil {
		return store.Lease{}, s.c.classify("lease "+name, err, false)
	}
	lease.Held = lease.Holder == holder
	lease.Expires = lease.Expires.UTC()
	return lease, nil
}

// LeaseRelease ends holder's lease at once (its expiry becomes now, so the
// next acquire by anyone takes it over); a lease held by another is left
// alone.
func (s *Store) LeaseRelease(ctx context.Context, name, holder string) error {
	_, err := s.pool.Exec(ctx, `UPDATE leases SET expires_at = clock_timestamp() WHERE name = $1 AND holder = $2`, name, holder)
	if err != nil {
		return s.c.classify("lease "+name+": release", err, false)
	}
	return nil
}
