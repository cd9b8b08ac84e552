package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// checkpointPage is how many checkpoint account rows one transaction of
// a checkpoint writer inserts or deletes.
const checkpointPage = 1024

// accountPage is how many accounts one query of an audit's account
// streams reads (AuditSnapshot): a page is what the audit holds of them.
var accountPage = 1024

// streamAccounts sets snap's account streams: the accounts and the last
// checkpoint's accounts, read in key order a page at a time in tx, each
// page by a keyset query on the key's unique index.
func (s *Store) streamAccounts(ctx context.Context, tx pgx.Tx, snap *ledger.Snapshot) {
	snap.AccountStream = func(yield func(*ledger.Account) error) error {
		var after ledger.AccountKey
		for n := 0; ; n++ {
			var rows pgx.Rows
			var err error
			if n == 0 {
				rows, err = tx.Query(ctx, accountSelect+` WHERE a.id IN (SELECT id FROM accounts
					ORDER BY subject, route, region, generation LIMIT $1)
					ORDER BY a.subject, a.route, a.region, a.generation, t.dim`, accountPage)
			} else {
				rows, err = tx.Query(ctx, accountSelect+` WHERE a.id IN (SELECT id FROM accounts
					WHERE (subject, route, region, generation) > ($1, $2, $3, $4)
					ORDER BY subject, route, region, generation LIMIT $5)
					ORDER BY a.subject, a.route, a.region, a.generation, t.dim`,
					after.Subject, after.Route, after.Region, int64(after.Generation), accountPage)
			}
			if err != nil {
				return s.c.classify("snapshot: accounts", err, false)
			}
			page, _, err := scanAccounts(rows)
			if err != nil {
				return s.c.classify("snapshot: accounts", err, false)
			}
			for i := range page {
				if err := yield(&page[i]); err != nil {
					return err
				}
			}
			if len(page) < accountPage {
				return nil
			}
			after = page[len(page)-1].Key
		}
	}
	last := snap.LastCheckpoint()
	if last == nil {
		return
	}
	seq := last.Seq
	snap.CheckpointAccountStream = func(yield func(*ledger.CheckpointAccount) error) error {
		page := make([]ledger.CheckpointAccount, 0, accountPage)
		// The row comparison leads with seq, so it walks the primary key.
		after := []any{seq, "", "", "", int64(-1 << 63)}
		for {
			page = page[:0]
			rows, err := tx.Query(ctx, `SELECT subject, route, region, generation, balances, entries, journal
				FROM checkpoint_accounts WHERE seq = $1 AND (seq, subject, route, region, generation) > ($1, $2, $3, $4, $5)
				ORDER BY subject, route, region, generation LIMIT $6`, append(after, accountPage)...)
			if err != nil {
				return s.c.classify("checkpoint accounts", err, false)
			}
			for rows.Next() {
				var (
					a          ledger.CheckpointAccount
					generation int64
					balances   []byte
				)
				if err := rows.Scan(&a.Account.Subject, &a.Account.Route, &a.Account.Region, &generation, &balances, &a.Entries, &a.Journal); err != nil {
					rows.Close()
					return s.c.classify("checkpoint accounts", err, false)
				}
				a.Account.Generation = uint64(generation)
				if a.Balances, err = codec.DecodeBalances(balances); err != nil {
					rows.Close()
					return fmt.Errorf("checkpoint %d accounts: %w", seq, err)
				}
				page = append(page, a)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return s.c.classify("checkpoint accounts", err, false)
			}
			for i := range page {
				if err := yield(&page[i]); err != nil {
					return err
				}
			}
			if len(page) < accountPage {
				return nil
			}
			k := page[len(page)-1].Account
			after = []any{seq, k.Subject, k.Route, k.Region, int64(k.Generation)}
		}
	}
}

// JournalAfter implements store.CheckpointStore: one probe of journal's
// primary key. A row inserted but not yet committed is not seen; its
// seq is beyond the last checkpoint's Through (AuditSnapshot's cut
// position waits for every writer of one at or below it), so the next
// pass sees it.
func (s *Store) JournalAfter(ctx context.Context, pos int64) (bool, error) {
	var after bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM journal WHERE seq > $1)`, pos).Scan(&after); err != nil {
		return false, s.c.classify("journal after", err, false)
	}
	return after, nil
}

// checkpointLease is the lease (leases table, so per schema) a checkpoint
// writer holds: one writer at a time across replicas, so no attempt
// deletes the rows another is staging.
const checkpointLease = "checkpoint"

// checkpointLeaseTTL is how long a checkpoint writer's lease lasts after
// its last transaction. Every transaction of the writer renews it, so it
// needs only to outlast the gap between two of them (a page of the
// paced audit, a few seconds at most) for the writer to keep it without
// anyone waiting; and it bounds how long the cuts stay refused after a
// writer died without Close (a killed process, a lost connection): 60 s
// is within the compaction worker's default one-minute interval, so the
// next replica's next pass takes it over. A writer whose lease lapsed
// goes on while nobody took it over; once another did, the lapsed one's
// transactions are refused (fenced).
const checkpointLeaseTTL = 60 * time.Second

// checkpointRenewSQL renews the lease of a writer (name $1, holder $2,
// fence $3) for $4 microseconds; no row when another writer took it over.
// It runs first in each of the writer's transactions, so the row lock it
// takes keeps a takeover out until the writes commit or roll back.
const checkpointRenewSQL = `UPDATE leases SET expires_at = clock_timestamp() + $4 * interval '1 microsecond'
	WHERE name = $1 AND holder = $2 AND fence = $3`

// CheckpointWrite implements store.CheckpointStore: the writer takes the
// lease checkpointLease for a holder of its own (another writer holding
// it gets ErrConflict), stages the accounts a transaction of
// checkpointPage rows at a time under their seq (invisible: readers read
// the accounts of the last stored header only) and stores the header
// last in a short transaction that locks the chain and checks it still
// follows. Rows staged by an attempt that never stored its header are
// deleted first. Each transaction renews the lease and checks the writer
// still holds it (holder and fence) before its writes, so nothing
// depends on a server session (PgBouncer in transaction mode runs each
// transaction on whichever server connection is free) and a writer whose
// lease was taken over writes nothing more.
func (s *Store) CheckpointWrite(ctx context.Context, seq int64) (store.CheckpointWriter, error) {
	ttl := s.checkpointTTL
	if ttl <= 0 {
		ttl = checkpointLeaseTTL
	}
	// The holder names this attempt, unique across replicas and time: a
	// transaction id the database hands out once (the store draws no
	// randomness of its own; txid_current, not pg_current_xact_id, for
	// PostgreSQL 12).
	var holder string
	if err := s.pool.QueryRow(ctx, `SELECT 'checkpoint-' || txid_current()::text`).Scan(&holder); err != nil {
		return nil, s.c.classify(fmt.Sprintf("checkpoint %d: holder", seq), err, false)
	}
	lease, err := s.LeaseAcquire(ctx, checkpointLease, holder, ttl)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %d: %w", seq, err)
	}
	if !lease.Held {
		return nil, fmt.Errorf("checkpoint %d: another checkpoint is being written (lease %q held by %s until %s): %w",
			seq, checkpointLease, lease.Holder, lease.Expires.Format(time.RFC3339Nano), store.ErrConflict)
	}
	w := &checkpointWriter{s: s, seq: seq, holder: holder, fence: lease.Fence, ttlMicros: int64((ttl + time.Microsecond - 1) / time.Microsecond)}
	var last int64
	if err := s.pool.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM checkpoints`).Scan(&last); err != nil {
		w.Close()
		return nil, s.c.classify("checkpoint", err, false)
	}
	if seq != last+1 {
		w.Close()
		return nil, fmt.Errorf("checkpoint %d does not follow %d: %w", seq, last, store.ErrConflict)
	}
	if err := w.deletePages(ctx, `seq >= $1`, seq); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// checkpointWriter is the PostgreSQL store.CheckpointWriter.
type checkpointWriter struct {
	s   *Store
	seq int64
	// holder and fence name the writer's checkpointLease, renewed for
	// ttlMicros by each of its transactions; closed once Close released it.
	holder    string
	fence     int64
	ttlMicros int64
	closed    bool
}

// tx runs f in a transaction on the pool that first renews the writer's
// lease: ErrConflict, and nothing written, when another writer took it
// over. what names the step in errors.
func (w *checkpointWriter) tx(ctx context.Context, what string, f func(tx pgx.Tx) error) error {
	if w.closed {
		return fmt.Errorf("checkpoint %d: %s: the writer is closed", w.seq, what)
	}
	err := pgx.BeginFunc(ctx, w.s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, checkpointRenewSQL, checkpointLease, w.holder, w.fence, w.ttlMicros)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("checkpoint %d: %s: the writer's lease %q (fence %d) was taken over: %w",
				w.seq, what, checkpointLease, w.fence, store.ErrConflict)
		}
		return f(tx)
	})
	if errors.Is(err, store.ErrConflict) {
		return err
	}
	if err != nil {
		return w.s.c.classify("checkpoint: "+what, err, true)
	}
	return nil
}

// deletePages deletes the checkpoint account rows where cond ($1 is arg),
// a page per transaction.
func (w *checkpointWriter) deletePages(ctx context.Context, cond string, arg int64) error {
	for {
		var n int64
		err := w.tx(ctx, "delete accounts", func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `DELETE FROM checkpoint_accounts WHERE ctid IN (
				SELECT ctid FROM checkpoint_accounts WHERE `+cond+` LIMIT $2)`, arg, checkpointPage)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return err
		}
		if n < checkpointPage {
			return nil
		}
	}
}

// Put implements store.CheckpointWriter: one transaction (one INSERT) per
// checkpointPage rows.
func (w *checkpointWriter) Put(ctx context.Context, page []ledger.CheckpointAccount) error {
	var conv codec.Conv
	for i := range page {
		conv.Int(page[i].Account.Generation)
	}
	if err := conv.Err(); err != nil {
		return fmt.Errorf("checkpoint %d: %w", w.seq, err)
	}
	for start := 0; start < len(page); start += checkpointPage {
		part := page[start:min(start+checkpointPage, len(page))]
		n := len(part)
		subject, route, region := make([]string, n), make([]string, n), make([]string, n)
		generation, entries := make([]int64, n), make([]int64, n)
		balances, journal := make([][]byte, n), make([]string, n)
		for i := range part {
			a := &part[i]
			subject[i], route[i], region[i], generation[i] = a.Account.Subject, a.Account.Route, a.Account.Region, int64(a.Account.Generation)
			balances[i], entries[i], journal[i] = codec.EncodeBalances(&a.Balances), a.Entries, a.Journal
		}
		err := w.tx(ctx, "accounts", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO checkpoint_accounts (seq, subject, route, region, generation, balances, entries, journal)
				SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[], $7::bigint[], $8::text[])`,
				w.seq, subject, route, region, generation, balances, entries, journal)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Finish implements store.CheckpointWriter.
func (w *checkpointWriter) Finish(ctx context.Context, c *ledger.Checkpoint) error {
	var conv codec.Conv
	cutAt := conv.Nanos(c.CutAt)
	if err := conv.Err(); err != nil {
		return fmt.Errorf("checkpoint %d: %w", c.Seq, err)
	}
	if c.Seq != w.seq {
		return fmt.Errorf("checkpoint %d finished by the writer of %d", c.Seq, w.seq)
	}
	err := w.tx(ctx, "header", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE checkpoints IN EXCLUSIVE MODE`); err != nil {
			return err
		}
		var seq, through int64
		var prev string
		err := tx.QueryRow(ctx, `SELECT seq, through, digest FROM checkpoints ORDER BY seq DESC LIMIT 1`).Scan(&seq, &through, &prev)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if c.Seq != seq+1 || c.Prev != prev || c.Through <= through {
			return fmt.Errorf("checkpoint %d (previous %q, through %d) does not follow %d (%q, through %d): %w",
				c.Seq, c.Prev, c.Through, seq, prev, through, store.ErrConflict)
		}
		_, err = tx.Exec(ctx, `INSERT INTO checkpoints (seq, through, cut_at, entries, moves, prev, accounts_digest, digest)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, c.Seq, c.Through, cutAt, c.Entries, c.Moves, c.Prev, c.AccountsDigest, c.Digest)
		return err
	})
	if err != nil {
		return err
	}
	// The header is stored: what follows only frees space, and what it
	// leaves the next checkpoint's write deletes.
	_ = w.deletePages(ctx, `seq <= $1`, c.Seq-2)
	return nil
}

// Close implements store.CheckpointWriter: it releases the lease if the
// writer still holds it (expires it, so the next writer takes it over at
// once). A release that fails leaves the lease to lapse after its TTL.
func (w *checkpointWriter) Close() {
	if w.closed {
		return
	}
	w.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = w.s.pool.Exec(ctx, `UPDATE leases SET expires_at = clock_timestamp()
		WHERE name = $1 AND holder = $2 AND fence = $3`, checkpointLease, w.holder, w.fence)
}
