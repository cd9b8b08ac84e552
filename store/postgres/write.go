package postgres

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// column is one column of a multi-row write: its name and the PostgreSQL
// type of its values. A vector column (bigint[4], an amount per dimension)
// travels as one flat bigint[] of ledger.MaxDimensions values per row, because a
// two-dimensional array would unnest to its elements, and is sliced back
// per row in SQL.
type column struct {
	name, typ string
	vector    bool
}

// accountKeyColumns are the first four arrays of every write that refers
// to an account: the key, resolved to accounts.id in SQL.
var accountKeyColumns = []column{{"subject", "text", false}, {"route", "text", false}, {"region", "text", false}, {"generation", "bigint", false}}

// unnestWrite returns an INSERT of one row per array element,
//
//	INSERT INTO table (cols) SELECT ... FROM unnest($1::typ[], ...) WITH ORDINALITY AS v(...) ORDER BY ord
//
// so a whole batch of rows is one statement with a fixed text (prepared
// once per connection). Parameters follow the order of cols. With keyed
// set, four account-key arrays come first and the row gets account_id
// instead (NULL, refused by the NOT NULL constraint, when no such account
// exists). With conflict set the statement is an upsert replacing every
// other column.
func unnestWrite(table string, keyed bool, cols []column, conflict ...string) string {
	var all []column
	if keyed {
		all = append(all, accountKeyColumns...)
	}
	all = append(all, cols...)
	var target, values, params, names []string
	if keyed {
		target = append(target, "account_id")
		values = append(values, `(SELECT a.id FROM accounts a WHERE a.subject = v.subject AND a.route = v.route
			AND a.region = v.region AND a.generation = v.generation)`)
	}
	for i, c := range all {
		param := fmt.Sprintf("$%d::%s[]", i+1, c.typ)
		if c.vector {
			values = append(values, fmt.Sprintf("(%[1]s)[(v.ord - 1) * %[2]d + 1 : v.ord * %[2]d]", param, ledger.MaxDimensions))
		} else {
			params, names = append(params, param), append(names, c.name)
			if i >= len(all)-len(cols) {
				values = append(values, "v."+c.name)
			}
		}
	}
	for _, c := range cols {
		target = append(target, c.name)
	}
	sql := fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM unnest(%s) WITH ORDINALITY AS v(%s, ord) ORDER BY v.ord",
		table, strings.Join(target, ", "), strings.Join(values, ", "), strings.Join(params, ", "), strings.Join(names, ", "))
	if len(conflict) > 0 {
		var set []string
		for _, name := range target {
			if !slices.Contains(conflict, name) {
				set = append(set, name+" = EXCLUDED."+name)
			}
		}
		sql += fmt.Sprintf(" ON CONFLICT (%s) DO UPDATE SET %s", strings.Join(conflict, ", "), strings.Join(set, ", "))
	}
	return sql
}

func col(name, typ string) column { return column{name: name, typ: typ} }
func vec(name string) column      { return column{name: name, typ: "bigint", vector: true} }

var (
	metaColumns   = []column{col("name", "text"), col("value", "bigint")}
	policyColumns = []column{col("generation", "bigint"), col("subject", "text"), col("route", "text"),
		col("region", "text"), col("dimensions", "bytea"), col("estimator_digest", "text"), col("hold_ttl", "bigint"),
		col("execution_limit", "bigint"), col("priority", "bigint"), col("fairness_weight", "bigint"),
		col("fairness_budget", "float8"), col("emergency_mode", "boolean"), col("rollout", "text"),
		col("epoch_length", "bigint"), col("published_at", "bigint"), col("rolled_back", "boolean")}
	headColumns = []column{col("subject", "text"), col("route", "text"), col("region", "text"),
		col("active", "bigint"), col("latest", "bigint")}
	accountColumns = []column{col("subject", "text"), col("route", "text"), col("region", "text"),
		col("generation", "bigint"), col("dims", "smallint"), col("epoch_start", "bigint"), col("breaches", "bigint"),
		col("version", "bigint")}
	termNames = []string{"opening", "minted", "overdraft_issued", "available", "reserved", "spent",
		"retired_for_emergency", "retired_for_move", "overdraft_repaid"}
	termColumns = func() []column {
		cols := []column{col("dim", "smallint")}
		for _, n := range termNames {
			cols = append(cols, col(n, "bigint"))
		}
		for _, n := range termNames {
			cols = append(cols, col("epoch_"+n, "bigint"))
		}
		return append(cols, col("refilled_to", "bigint"), col("held_elsewhere", "bigint"))
	}()
	currentColumns = []column{col("subject", "text"), col("route", "text"), col("region", "text"),
		col("generation", "bigint")}
	reservationColumns = []column{col("subject", "text"), col("route", "text"), col("region", "text"),
		col("generation", "bigint"), col("id", "text"), col("request_digest", "text"), col("accounting_epoch", "bigint"),
		vec("reserved"), vec("actual"), vec("overdraft"), col("operation_id", "text"), col("state", "smallint"),
		col("created_at", "bigint"), col("expires_at", "bigint"), col("started_at", "bigint"),
		col("execution_deadline", "bigint"), col("unknown_at", "bigint"), col("finished_at", "bigint"), col("breach", "boolean")}
	moveColumns = []column{col("receipt_id", "text"), col("kind", "smallint"), col("from_subject", "text"),
		col("from_route", "text"), col("from_region", "text"), col("from_generation", "bigint"),
		col("to_subject", "text"), col("to_route", "text"), col("to_region", "text"), col("to_generation", "bigint"),
		vec("units"), vec("debt"), col("at", "bigint")}
	shardColumns = []column{col("id", "text"), col("subject", "text"), col("route", "text"), col("region", "text"),
		col("generation", "bigint"), col("gateway_id", "text"), col("boot_epoch", "bigint"), col("fence", "bigint"),
		vec("allocated"), vec("spent"), vec("unknown"), vec("reminted"), col("issued_at", "bigint"),
		col("expires_at", "bigint"), col("key_id", "text"), col("signature", "bytea"), col("reconciled", "boolean")}
	journalColumns = []column{col("subject", "text"), col("route", "text"), col("region", "text"),
		col("generation", "bigint"), col("at", "bigint"), col("kind", "smallint"), col("reservation_id", "text"),
		col("from_state", "smallint"), col("to_state", "smallint"), col("receipt_id", "text"), col("delta", "bytea")}
)

var (
	sqlMetaInsert        = unnestWrite("meta", false, metaColumns)
	sqlMetaUpsert        = unnestWrite("meta", false, metaColumns, "name")
	sqlPolicyUpsert      = unnestWrite("policies", false, policyColumns, "generation")
	sqlHeadInsert        = unnestWrite("policy_heads", false, headColumns)
	sqlHeadUpsert        = unnestWrite("policy_heads", false, headColumns, "subject", "route", "region")
	sqlAccountInsert     = unnestWrite("accounts", false, accountColumns)
	sqlAccountUpsert     = unnestWrite("accounts", false, accountColumns, "subject", "route", "region", "generation")
	sqlTermsUpsert       = unnestWrite("account_terms", true, termColumns, "account_id", "dim")
	sqlCurrentInsert     = unnestWrite("account_currents", false, currentColumns)
	sqlCurrentUpsert     = unnestWrite("account_currents", false, currentColumns, "subject", "route", "region")
	sqlReservationInsert = unnestWrite("reservations", false, reservationColumns)
	sqlReservationUpsert = unnestWrite("reservations", false, reservationColumns, "id")
	sqlMoveInsert        = unnestWrite("moves", false, moveColumns)
	sqlShardInsert       = unnestWrite("shards", false, shardColumns)
	sqlShardUpsert       = unnestWrite("shards", false, shardColumns, "id")
	sqlJournalInsert     = unnestWrite("journal", false, journalColumns)
	sqlTermsTrim         = `DELETE FROM account_terms t USING accounts a,
		unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::smallint[]) AS v(subject, route, region, generation, n)
		WHERE a.subject = v.subject AND a.route = v.route AND a.region = v.region AND a.generation = v.generation
		AND t.account_id = a.id AND t.dim >= v.n`
	sqlStatementInsert = `WITH st AS (
			INSERT INTO statements (subject, route, region, generation, epoch_start, epoch_end, dims)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			RETURNING id)
		INSERT INTO statement_terms (statement_id, dim, closing, ` + strings.Join(termNames, ", ") + `)
		SELECT st.id, v.* FROM st, unnest($8::smallint[], $9::boolean[], $10::bigint[], $11::bigint[],
			$12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[], $18::bigint[]) AS v`
)

// batchWriter collects the statements of one Write and sends them in one
// round trip.
type batchWriter struct {
	batch pgx.Batch
	ops   []string
	conv  codec.Conv
	err   error
	// planEachRun wraps the lookups by arrays of keys (queueLookup).
	planEachRun bool
}

func (w *batchWriter) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *batchWriter) queue(op, sql string, args ...any) {
	w.batch.Queue(sql, args...)
	w.ops = append(w.ops, op)
}

// Write applies the batch's changes in the fixed order of store.Tx.Write,
// as one pgx.Batch: one statement per table and kind of write (insert of
// rows this transaction found absent, upsert of the rest), so a group of a
// hundred reservations costs one round trip, not hundreds.
//
// Returns nil; an error wrapping store.ErrDuplicate when an insert hit a
// primary key or unique constraint (a concurrent writer created the row
// first); store.ErrConflict / store.ErrUnavailable as classify says; or an
// error naming a refused CHECK (a negative term, an unbalanced account) or
// a value that cannot be stored. After an error the transaction is dead:
// roll it back.
func (t *tx) Write(ctx context.Context, c *store.Changes) error {
	if t.done {
		return fmt.Errorf("write: %w", pgx.ErrTxClosed)
	}
	if c.Empty() {
		return nil
	}
	w := batchWriter{planEachRun: t.s.planPerStatement}
	t.writeMeta(&w, c.Meta)
	if len(c.MetaRemoved) > 0 {
		w.queue("delete meta", `DELETE FROM meta WHERE name = ANY($1::text[])`, c.MetaRemoved)
	}
	t.writePolicies(&w, c.Policies)
	t.writeHeads(&w, c.Heads)
	t.writeAccounts(&w, c.Accounts)
	t.writeCurrents(&w, c.Currents)
	t.deleteReservations(&w, c.Retention.RemovedReservations)
	t.writeReservations(&w, c)
	t.writeMoves(&w, c.Moves)
	t.writeShards(&w, c.Shards)
	t.deleteShards(&w, c.RemovedShards)
	for i := range c.Statements {
		t.writeStatement(&w, &c.Statements[i])
	}
	t.writeRetention(&w, &c.Retention)
	t.writeJournal(&w, c.Journal)
	if err := cmp.Or(w.err, w.conv.Err()); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	results := t.tx.SendBatch(ctx, &w.batch)
	for _, op := range w.ops {
		if _, err := results.Exec(); err != nil {
			results.Close()
			return t.s.c.classify("write "+op, err, false)
		}
	}
	if err := results.Close(); err != nil {
		return t.s.c.classify("write", err, false)
	}
	t.written(c)
	return nil
}

// written updates what the transaction knows after c was stored: its rows
// exist now (a later Write of them in this transaction is an update, not a
// second insert), and its accounts have the dimension rows just written.
func (t *tx) written(c *store.Changes) {
	t.prefetched = nil
	t.forgetPrefetch()
	for name, value := range c.Meta {
		delete(t.absent, metaRow(name))
		t.owing.written(name, value, true)
	}
	for _, name := range c.MetaRemoved {
		t.absent[metaRow(name)] = true
		t.owing.written(name, 0, false)
	}
	for _, id := range c.RemovedShards {
		t.absent[rowKey{rank: rankShard, a: id}] = true
	}
	for i := range c.Heads {
		delete(t.absent, policyKeyRow(tagHead, c.Heads[i].Key))
	}
	for i := range c.Accounts {
		a := &c.Accounts[i]
		delete(t.absent, accountRow(a.Key))
		t.termRows[a.Key] = usedDims(a)
	}
	for i := range c.Currents {
		delete(t.absent, policyKeyRow(tagCurrent, c.Currents[i].Subject))
	}
	// Removed rows first, as Write deleted them: an id retired and
	// admitted again in c exists.
	for _, id := range c.Retention.RemovedReservations {
		t.absent[rowKey{rank: rankReservation, a: id}] = true
	}
	for i := range c.Reservations {
		delete(t.absent, rowKey{rank: rankReservation, a: c.Reservations[i].ID})
	}
	for i := range c.Shards {
		delete(t.absent, rowKey{rank: rankShard, a: c.Shards[i].ID})
	}
	t.retentionWritten(&c.Retention)
}

// split sends rows found absent in this transaction to the insert arrays
// and the rest to the upsert arrays.
func split[T any](t *tx, rows []T, key func(*T) rowKey) (inserts, upserts []*T) {
	for i := range rows {
		if t.absent[key(&rows[i])] {
			inserts = append(inserts, &rows[i])
		} else {
			upserts = append(upserts, &rows[i])
		}
	}
	return inserts, upserts
}

func (t *tx) writeMeta(w *batchWriter, meta map[string]int64) {
	if len(meta) == 0 {
		return
	}
	var insNames, upsNames []string
	var insV, upsV []int64
	for _, name := range slices.Sorted(maps.Keys(meta)) {
		value := meta[name]
		if t.absent[metaRow(name)] {
			insNames, insV = append(insNames, name), append(insV, value)
		} else {
			upsNames, upsV = append(upsNames, name), append(upsV, value)
		}
	}
	if len(insNames) > 0 {
		w.queue("meta", sqlMetaInsert, insNames, insV)
	}
	if len(upsNames) > 0 {
		w.queue("meta", sqlMetaUpsert, upsNames, upsV)
	}
}

func (t *tx) writePolicies(w *batchWriter, policies []ledger.Policy) {
	if len(policies) == 0 {
		return
	}
	n := len(policies)
	var (
		generation, holdTTL, execLimit, priority, weight, epochLen, published = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		subject, route, region, digest, rollout                               = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		dims                                                                  = make([][]byte, n)
		budget                                                                = make([]float64, n)
		emergency, rolledBack                                                 = make([]bool, n), make([]bool, n)
	)
	for i := range policies {
		p := &policies[i]
		generation[i] = w.conv.Int(p.Generation)
		subject[i], route[i], region[i] = p.Key.Subject, p.Key.Route, p.Key.Region
		encoded, err := codec.EncodeDimensions(p.Dimensions)
		if err != nil {
			w.fail(fmt.Errorf("policy %d: %w", p.Generation, err))
		}
		dims[i] = encoded
		digest[i] = p.EstimatorDigest
		holdTTL[i], execLimit[i], epochLen[i] = int64(p.HoldTTL), int64(p.ExecutionLimit), int64(p.EpochLength)
		priority[i], weight[i], budget[i] = int64(p.Priority), p.FairnessWeight, p.FairnessBudget
		emergency[i], rollout[i], rolledBack[i] = p.EmergencyMode, string(p.Rollout), p.RolledBack
		published[i] = w.conv.Nanos(p.PublishedAt)
	}
	w.queue("policies", sqlPolicyUpsert, generation, subject, route, region, dims, digest, holdTTL, execLimit,
		priority, weight, budget, emergency, rollout, epochLen, published, rolledBack)
}

func (t *tx) writeHeads(w *batchWriter, heads []ledger.PolicyHead) {
	inserts, upserts := split(t, heads, func(h *ledger.PolicyHead) rowKey { return policyKeyRow(tagHead, h.Key) })
	for _, rows := range [...]struct {
		sql  string
		list []*ledger.PolicyHead
	}{{sqlHeadInsert, inserts}, {sqlHeadUpsert, upserts}} {
		if len(rows.list) == 0 {
			continue
		}
		n := len(rows.list)
		subject, route, region := make([]string, n), make([]string, n), make([]string, n)
		active, latest := make([]int64, n), make([]int64, n)
		for i, h := range rows.list {
			subject[i], route[i], region[i] = h.Key.Subject, h.Key.Route, h.Key.Region
			active[i], latest[i] = w.conv.Int(h.Active), w.conv.Int(h.Latest)
		}
		w.queue("policy heads", rows.sql, subject, route, region, active, latest)
	}
}

// usedDims returns how many dimension rows an account needs: its
// dimension count, widened to cover any non-zero value past it, and at
// least one (so the account's rows join to a term row).
func usedDims(a *ledger.Account) int {
	n := max(a.Dims, 1)
	for d := ledger.MaxDimensions - 1; d >= n; d-- {
		if a.Balances[d] != (ledger.Balance{}) || a.EpochOpening[d] != (ledger.Balance{}) || a.RefilledTo[d] != 0 || a.HeldElsewhere[d] != 0 {
			return d + 1
		}
	}
	return n
}

func (t *tx) writeAccounts(w *batchWriter, accounts []ledger.Account) {
	if len(accounts) == 0 {
		return
	}
	inserts, upserts := split(t, accounts, func(a *ledger.Account) rowKey { return accountRow(a.Key) })
	for _, rows := range [...]struct {
		sql  string
		list []*ledger.Account
	}{{sqlAccountInsert, inserts}, {sqlAccountUpsert, upserts}} {
		if len(rows.list) == 0 {
			continue
		}
		n := len(rows.list)
		subject, route, region := make([]string, n), make([]string, n), make([]string, n)
		generation, epochStart, breaches, version := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		dims := make([]int16, n)
		for i, a := range rows.list {
			subject[i], route[i], region[i] = a.Key.Subject, a.Key.Route, a.Key.Region
			generation[i], dims[i], epochStart[i] = w.conv.Int(a.Key.Generation), int16(a.Dims), w.conv.Nanos(a.EpochStart)
			breaches[i], version[i] = a.Breaches, w.conv.Int(a.Version)
			if a.Dims < 0 || a.Dims > ledger.MaxDimensions {
				w.fail(fmt.Errorf("account %s: %d dimensions", a.Key, a.Dims))
			}
		}
		w.queue("accounts", rows.sql, subject, route, region, generation, dims, epochStart, breaches, version)
	}

	// Term rows: one per account and used dimension, all accounts in one
	// upsert (the account rows above are locked by this transaction, so
	// nothing else writes these rows concurrently).
	var (
		subject, route, region []string
		generation             []int64
		dim                    []int16
		terms                  [2 * 9][]int64
		refilledTo, held       []int64
		trimS                  [3][]string
		trimG                  []int64
		trimN                  []int16
	)
	for i := range accounts {
		a := &accounts[i]
		n := usedDims(a)
		g := w.conv.Int(a.Key.Generation)
		for d := 0; d < n; d++ {
			subject, route, region = append(subject, a.Key.Subject), append(route, a.Key.Route), append(region, a.Key.Region)
			generation, dim = append(generation, g), append(dim, int16(d))
			for j, v := range balanceTerms(&a.Balances[d]) {
				terms[j] = append(terms[j], v)
			}
			for j, v := range balanceTerms(&a.EpochOpening[d]) {
				terms[9+j] = append(terms[9+j], v)
			}
			refilledTo, held = append(refilledTo, a.RefilledTo[d]), append(held, a.HeldElsewhere[d])
		}
		// Rows past n exist only if the account was wider before; drop
		// them when this transaction saw more, or never read the account.
		loaded, read := t.termRows[a.Key]
		if (read && loaded > n) || (!read && !t.absent[accountRow(a.Key)]) {
			trimS[0], trimS[1], trimS[2] = append(trimS[0], a.Key.Subject), append(trimS[1], a.Key.Route), append(trimS[2], a.Key.Region)
			trimG, trimN = append(trimG, g), append(trimN, int16(n))
		}
	}
	args := []any{subject, route, region, generation, dim}
	for j := range terms {
		args = append(args, terms[j])
	}
	args = append(args, refilledTo, held)
	w.queue("account terms", sqlTermsUpsert, args...)
	if len(trimG) > 0 {
		w.queueLookup("account terms", sqlTermsTrim, trimS[0], trimS[1], trimS[2], trimG, trimN)
	}
}

// balanceTerms returns a balance's nine terms in the order of termNames.
func balanceTerms(b *ledger.Balance) [9]int64 {
	return [9]int64{b.Opening, b.Minted, b.OverdraftIssued, b.Available, b.Reserved, b.Spent,
		b.RetiredForEmergency, b.RetiredForMove, b.OverdraftRepaid}
}

func (t *tx) writeCurrents(w *batchWriter, currents []store.Current) {
	inserts, upserts := split(t, currents, func(c *store.Current) rowKey { return policyKeyRow(tagCurrent, c.Subject) })
	for _, rows := range [...]struct {
		sql  string
		list []*store.Current
	}{{sqlCurrentInsert, inserts}, {sqlCurrentUpsert, upserts}} {
		if len(rows.list) == 0 {
			continue
		}
		n := len(rows.list)
		subject, route, region := make([]string, n), make([]string, n), make([]string, n)
		generation := make([]int64, n)
		for i, c := range rows.list {
			subject[i], route[i], region[i] = c.Subject.Subject, c.Subject.Route, c.Subject.Region
			generation[i] = w.conv.Int(c.Generation)
		}
		w.queue("account currents", rows.sql, subject, route, region, generation)
	}
}

func (t *tx) writeReservations(w *batchWriter, c *store.Changes) {
	if len(c.Reservations) == 0 {
		return
	}
	var inserts, upserts []*ledger.Reservation
	for i := range c.Reservations {
		r := &c.Reservations[i]
		if c.NewReservations[r.ID] || t.absent[rowKey{rank: rankReservation, a: r.ID}] {
			inserts = append(inserts, r)
		} else {
			upserts = append(upserts, r)
		}
	}
	for _, rows := range [...]struct {
		sql  string
		list []*ledger.Reservation
	}{{sqlReservationInsert, inserts}, {sqlReservationUpsert, upserts}} {
		if len(rows.list) == 0 {
			continue
		}
		n := len(rows.list)
		var (
			subject, route, region                   = make([]string, n), make([]string, n), make([]string, n)
			id, digest, operation                    = make([]string, n), make([]string, n), make([]string, n)
			generation, epoch                        = make([]int64, n), make([]int64, n)
			reserved, actual, overdraft              = make([]int64, 0, 4*n), make([]int64, 0, 4*n), make([]int64, 0, 4*n)
			state                                    = make([]int16, n)
			created, expires, started, deadline, fin = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
			unknown                                  = make([]int64, n)
			breach                                   = make([]bool, n)
		)
		for i, r := range rows.list {
			subject[i], route[i], region[i], generation[i] = r.Account.Subject, r.Account.Route, r.Account.Region, w.conv.Int(r.Account.Generation)
			id[i], digest[i], epoch[i] = r.ID, r.RequestDigest, w.conv.Nanos(r.AccountingEpoch)
			reserved, actual, overdraft = append(reserved, r.Reserved[:]...), append(actual, r.Actual[:]...), append(overdraft, r.Overdraft[:]...)
			operation[i], state[i] = r.OperationID, int16(r.State)
			created[i], expires[i], started[i] = w.conv.Nanos(r.CreatedAt), w.conv.Nanos(r.ExpiresAt), w.conv.Nanos(r.StartedAt)
			deadline[i], fin[i], breach[i] = w.conv.Nanos(r.ExecutionDeadline), w.conv.Nanos(r.FinishedAt), r.Breach
			unknown[i] = w.conv.Nanos(r.UnknownAt)
			if r.State == ledger.StateReservationUnknown {
				w.fail(fmt.Errorf("reservation %s: %s is the caller's state and is never stored", r.ID, r.State))
			}
		}
		w.queue("reservations", rows.sql, subject, route, region, generation, id, digest, epoch, reserved, actual,
			overdraft, operation, state, created, expires, started, deadline, unknown, fin, breach)
	}
}

func (t *tx) writeMoves(w *batchWriter, moves []ledger.Move) {
	if len(moves) == 0 {
		return
	}
	n := len(moves)
	var (
		receipt                              = make([]string, n)
		kind                                 = make([]int16, n)
		fromS, fromR, fromRg, toS, toR, toRg = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		fromG, toG, at                       = make([]int64, n), make([]int64, n), make([]int64, n)
		units, debt                          = make([]int64, 0, 4*n), make([]int64, 0, 4*n)
	)
	for i := range moves {
		m := &moves[i]
		receipt[i], kind[i] = m.ReceiptID, int16(m.Kind)
		fromS[i], fromR[i], fromRg[i], fromG[i] = m.From.Subject, m.From.Route, m.From.Region, w.conv.Int(m.From.Generation)
		toS[i], toR[i], toRg[i], toG[i] = m.To.Subject, m.To.Route, m.To.Region, w.conv.Int(m.To.Generation)
		units, debt = append(units, m.Units[:]...), append(debt, m.Debt[:]...)
		at[i] = w.conv.Nanos(m.At)
	}
	w.queue("moves", sqlMoveInsert, receipt, kind, fromS, fromR, fromRg, fromG, toS, toR, toRg, toG, units, debt, at)
}

func (t *tx) writeShards(w *batchWriter, shards []ledger.Shard) {
	inserts, upserts := split(t, shards, func(s *ledger.Shard) rowKey { return rowKey{rank: rankShard, a: s.ID} })
	for _, rows := range [...]struct {
		sql  string
		list []*ledger.Shard
	}{{sqlShardInsert, inserts}, {sqlShardUpsert, upserts}} {
		if len(rows.list) == 0 {
			continue
		}
		n := len(rows.list)
		var (
			id, subject, route, region, gateway, keyID = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			generation, boot, fence, issued, expires   = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
			allocated, spent, unknown, reminted        = make([]int64, 0, 4*n), make([]int64, 0, 4*n), make([]int64, 0, 4*n), make([]int64, 0, 4*n)
			signature                                  = make([][]byte, n)
			reconciled                                 = make([]bool, n)
		)
		for i, s := range rows.list {
			id[i], subject[i], route[i], region[i] = s.ID, s.Account.Subject, s.Account.Route, s.Account.Region
			generation[i], gateway[i], boot[i], fence[i] = w.conv.Int(s.Account.Generation), s.GatewayID, w.conv.Int(s.BootEpoch), w.conv.Int(s.Fence)
			allocated, spent = append(allocated, s.Allocated[:]...), append(spent, s.Spent[:]...)
			unknown, reminted = append(unknown, s.Unknown[:]...), append(reminted, s.Reminted[:]...)
			issued[i], expires[i], keyID[i] = w.conv.Nanos(s.IssuedAt), w.conv.Nanos(s.ExpiresAt), s.KeyID
			if len(s.Signature) > codec.MaxSignatureLen {
				w.fail(fmt.Errorf("shard %s: signature of %d bytes, at most %d", s.ID, len(s.Signature), codec.MaxSignatureLen))
			}
			signature[i], reconciled[i] = codec.EncodeSignature(s.Signature), s.Reconciled
		}
		w.queue("shards", rows.sql, id, subject, route, region, generation, gateway, boot, fence, allocated, spent,
			unknown, reminted, issued, expires, keyID, signature, reconciled)
	}
}

func (t *tx) writeStatement(w *batchWriter, st *ledger.Statement) {
	n := st.Dims
	for d := ledger.MaxDimensions - 1; d >= n; d-- {
		if st.Opening[d] != (ledger.Balance{}) || st.Closing[d] != (ledger.Balance{}) {
			n = d + 1
			break
		}
	}
	if st.Dims < 0 || st.Dims > ledger.MaxDimensions {
		w.fail(fmt.Errorf("statement %s: %d dimensions", st.Account, st.Dims))
		return
	}
	var (
		dim     []int16
		closing []bool
		terms   [9][]int64
	)
	for d := 0; d < n; d++ {
		for side, bal := range [2]*ledger.Balance{&st.Opening[d], &st.Closing[d]} {
			dim, closing = append(dim, int16(d)), append(closing, side == 1)
			for j, v := range balanceTerms(bal) {
				terms[j] = append(terms[j], v)
			}
		}
	}
	args := []any{st.Account.Subject, st.Account.Route, st.Account.Region, w.conv.Int(st.Account.Generation),
		w.conv.Nanos(st.EpochStart), w.conv.Nanos(st.EpochEnd), int16(st.Dims), dim, closing}
	for j := range terms {
		args = append(args, terms[j])
	}
	w.queue("statement "+st.Account.String(), sqlStatementInsert, args...)
}

func (t *tx) writeJournal(w *batchWriter, journal []ledger.JournalEntry) {
	if len(journal) == 0 {
		return
	}
	n := len(journal)
	var (
		subject, route, region, reservation, receipt = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		generation, at                               = make([]int64, n), make([]int64, n)
		kind, from, to                               = make([]int16, n), make([]int16, n), make([]int16, n)
		delta                                        = make([][]byte, n)
	)
	for i := range journal {
		e := &journal[i]
		subject[i], route[i], region[i], generation[i] = e.Account.Subject, e.Account.Route, e.Account.Region, w.conv.Int(e.Account.Generation)
		at[i], kind[i], reservation[i] = w.conv.Nanos(e.At), int16(e.Kind), e.ReservationID
		from[i], to[i], receipt[i] = int16(e.From), int16(e.To), e.ReceiptID
		delta[i] = codec.EncodeBalances(&e.Delta)
	}
	w.queue("journal", sqlJournalInsert, subject, route, region, generation, at, kind, reservation, from, to, receipt, delta)
}
