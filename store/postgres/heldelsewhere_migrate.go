package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
)

// migrationSteps are the Go parts of the migrations that need one, run
// after the version's SQL in the migration's transaction.
var migrationSteps = map[int]func(context.Context, pgx.Tx) error{
	23: countHeldElsewhere,
}

// heldSubjects selects the keys of the subjects an account of which,
// not the subject's current one, holds anything reserved: the only
// subjects whose current account counts anything held elsewhere.
const heldSubjects = `SELECT o.subject, o.route, o.region FROM accounts o
	JOIN account_terms ot ON ot.account_id = o.id
	JOIN account_currents c ON c.subject = o.subject AND c.route = o.route AND c.region = o.region
	WHERE ot.reserved > 0 AND o.generation <> c.generation`

// countHeldElsewhere sets held_elsewhere (schema version 23) of every
// subject's current account to what the subject's other accounts hold
// reserved in the units it limits (ledger.HeldElsewhereOf: the count the
// ledger carries from switch to switch, which a schema upgraded to
// version 22 began at 0 for the holds outstanding then), and clears it on
// every other term row. It first takes EXCLUSIVE locks on the tables it
// reads, so that replicas still running (of this version or an earlier
// one) cannot change a hold or a current pointer between its read and its
// commit: their writes wait for the migration. Not SHARE: a command's
// FOR NO KEY UPDATE read takes only ROW SHARE, which SHARE lets by, and
// that command's write would then wait for the migration while the
// migration's clearing waited for the command's row lock (a deadlock).
// EXCLUSIVE waits for such a command to end; plain reads still pass. It reads the accounts of
// the subjects with holds elsewhere only (heldSubjects), and every term
// row once for the clearing.
func countHeldElsewhere(ctx context.Context, tx pgx.Tx) error {
	// In the order a command's write takes them (accounts, their terms,
	// then the current pointers), so that the wait for a command that
	// wrote the first is not a deadlock with its write of the next.
	if _, err := tx.Exec(ctx, `LOCK TABLE accounts, account_terms, account_currents IN EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	rows, err := tx.Query(ctx, accountSelect+` WHERE (a.subject, a.route, a.region) IN (`+heldSubjects+`)
		ORDER BY a.subject, a.route, a.region, a.generation, t.dim`)
	if err != nil {
		return fmt.Errorf("read accounts: %w", err)
	}
	accounts, _, err := scanAccounts(rows)
	if err != nil {
		return fmt.Errorf("read accounts: %w", err)
	}
	currents := map[ledger.PolicyKey]uint64{}
	rows, err = tx.Query(ctx, `SELECT subject, route, region, generation FROM account_currents
		WHERE (subject, route, region) IN (`+heldSubjects+`)`)
	if err != nil {
		return fmt.Errorf("read currents: %w", err)
	}
	for rows.Next() {
		var k ledger.PolicyKey
		var generation int64
		if err := rows.Scan(&k.Subject, &k.Route, &k.Region, &generation); err != nil {
			rows.Close()
			return fmt.Errorf("read currents: %w", err)
		}
		currents[k] = uint64(generation)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read currents: %w", err)
	}
	policies := map[uint64]*ledger.Policy{}
	for _, a := range accounts {
		g := a.Key.Generation
		if _, ok := policies[g]; ok {
			continue
		}
		p, err := scanPolicy(tx.QueryRow(ctx, policySelect+` WHERE generation = $1`, int64(g)))
		if errors.Is(err, pgx.ErrNoRows) {
			// Not the ledger's to judge here: an account whose policy
			// is gone holds nothing HeldElsewhereOf can match.
			policies[g] = nil
			continue
		}
		if err != nil {
			return fmt.Errorf("read policy %d: %w", g, err)
		}
		policies[g] = p
	}
	if _, err := tx.Exec(ctx, `UPDATE account_terms SET held_elsewhere = 0 WHERE held_elsewhere <> 0`); err != nil {
		return fmt.Errorf("clear: %w", err)
	}
	// The counts, one row per current account and dimension that counts
	// something, written by one statement.
	var (
		subjects, routes, regions []string
		generations, units        []int64
		dims                      []int16
	)
	for start := 0; start < len(accounts); {
		subject := accounts[start].Key.SubjectKey()
		end := start
		for end < len(accounts) && accounts[end].Key.SubjectKey() == subject {
			end++
		}
		group := accounts[start:end]
		start = end
		g, ok := currents[subject]
		if !ok {
			continue
		}
		var cur *ledger.Account
		var others []ledger.Holding
		for i := range group {
			if a := &group[i]; a.Key.Generation == g {
				cur = a
			} else {
				others = append(others, ledger.Holding{Account: a, Policy: policies[a.Key.Generation]})
			}
		}
		if cur == nil || policies[g] == nil {
			continue
		}
		for d, held := range ledger.HeldElsewhereOf(cur, policies[g], others) {
			if held != 0 {
				subjects, routes, regions = append(subjects, subject.Subject), append(routes, subject.Route), append(regions, subject.Region)
				generations, dims, units = append(generations, int64(g)), append(dims, int16(d)), append(units, int64(held))
			}
		}
	}
	if len(units) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `UPDATE account_terms t SET held_elsewhere = c.held
		FROM accounts a, unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::smallint[], $6::bigint[])
			AS c(subject, route, region, generation, dim, held)
		WHERE a.subject = c.subject AND a.route = c.route AND a.region = c.region AND a.generation = c.generation
			AND t.account_id = a.id AND t.dim = c.dim`,
		subjects, routes, regions, generations, dims, units); err != nil {
		return fmt.Errorf("count: %w", err)
	}
	return nil
}
