package sqlite

import (
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/codec"
)

// Column lists, in the order of the args and scan functions below. Every
// statement is built from them, so a column is named in one place.
const (
	policyCols = "generation, subject, route, region, dimensions, estimator_digest, hold_ttl_ns, execution_limit_ns, " +
		"priority, fairness_weight, fairness_budget, emergency_mode, rollout, epoch_length_ns, published_at, rolled_back"
	headCols        = "subject, route, region, active, latest"
	accountCols     = accountColsV22 + ", held_elsewhere"
	currentCols     = "subject, route, region, generation"
	reservationCols = "id, request_digest, subject, route, region, generation, accounting_epoch, reserved, actual, overdraft, " +
		"operation_id, state, created_at, expires_at, started_at, execution_deadline, unknown_at, finished_at, breach"
	moveCols = "receipt_id, kind, from_subject, from_route, from_region, from_generation, " +
		"to_subject, to_route, to_region, to_generation, units, debt, at"
	shardCols = "id, subject, route, region, generation, gateway_id, boot_epoch, fence, amounts, issued_at, expires_at, " +
		"key_id, signature, reconciled"
	statementCols = "subject, route, region, generation, epoch_start, epoch_end, dims, opening, closing"
	journalCols   = "at, kind, subject, route, region, generation, reservation_id, from_state, to_state, receipt_id, delta"
	// accountColsV22 are the account columns up to schema version 22,
	// before held_elsewhere: what a migration step before 23 reads (with
	// NULL in its place) and an earlier binary wrote.
	accountColsV22 = "subject, route, region, generation, dims, balances, epoch_start, epoch_opening, refilled_to, breaches, version"
)

// insertSQL returns an INSERT of one row of cols (plus extra) into table.
func insertSQL(table, cols string, extra ...string) string {
	return insertRowsSQL(table, cols, 1, extra...)
}

// insertRowsSQL returns an INSERT of rows rows of cols (plus extra) into
// table: one statement for many rows saves the per-statement work of the
// driver and of database/sql, which dominates a batch's CPU time. More
// than one row: INSERT OR FAIL, so SQLite keeps no statement journal for
// it (see insertFresh; a plain multi-row INSERT into a table with a UNIQUE
// index copied every page it changed into a temporary file first).
func insertRowsSQL(table, cols string, rows int, extra ...string) string {
	all := strings.Split(cols, ", ")
	all = append(all, extra...)
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(all)), ", ") + ")"
	insert := "INSERT INTO "
	if rows > 1 {
		insert = "INSERT OR FAIL INTO "
	}
	return insert + table + " (" + strings.Join(all, ", ") + ") VALUES " +
		strings.TrimSuffix(strings.Repeat(row+", ", rows), ", ")
}

// upsertSQL returns an INSERT that replaces every non-key column of the row
// with key when it exists (ON CONFLICT DO UPDATE, so no other constraint
// is resolved silently).
func upsertSQL(table, cols, key string, extra ...string) string {
	keys := map[string]bool{}
	for _, k := range strings.Split(key, ", ") {
		keys[k] = true
	}
	var set []string
	for _, c := range append(strings.Split(cols, ", "), extra...) {
		if !keys[c] {
			set = append(set, c+" = excluded."+c)
		}
	}
	return insertSQL(table, cols, extra...) + " ON CONFLICT (" + key + ") DO UPDATE SET " + strings.Join(set, ", ")
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

func policyArgs(p *ledger.Policy, c *codec.Conv) []any {
	return []any{c.Int(p.Generation), p.Key.Subject, p.Key.Route, p.Key.Region, c.EncodeDimensions(p.Dimensions),
		p.EstimatorDigest, int64(p.HoldTTL), int64(p.ExecutionLimit), int64(p.Priority), p.FairnessWeight,
		p.FairnessBudget, c.Bool(p.EmergencyMode), string(p.Rollout), int64(p.EpochLength), c.Nanos(p.PublishedAt),
		c.Bool(p.RolledBack)}
}

func scanPolicy(sc scanner) (ledger.Policy, error) {
	var (
		p                                               ledger.Policy
		c                                               codec.Conv
		generation, hold, limit, priority, epoch, pubAt int64
		emergency, rolledBack                           bool
		dims                                            []byte
		rollout                                         string
	)
	err := sc.Scan(&generation, &p.Key.Subject, &p.Key.Route, &p.Key.Region, &dims, &p.EstimatorDigest, &hold, &limit,
		&priority, &p.FairnessWeight, &p.FairnessBudget, &emergency, &rollout, &epoch, &pubAt, &rolledBack)
	if err != nil {
		return p, err
	}
	p.Generation = c.Uint(generation)
	p.Dimensions = c.Dimensions(dims)
	p.HoldTTL, p.ExecutionLimit, p.EpochLength = durationOf(hold), durationOf(limit), durationOf(epoch)
	p.Priority = int(priority)
	p.EmergencyMode, p.RolledBack = emergency, rolledBack
	p.Rollout = ledger.RolloutMode(rollout)
	p.PublishedAt = c.Time(pubAt)
	return p, c.Err()
}

func headArgs(h *ledger.PolicyHead, c *codec.Conv) []any {
	return []any{h.Key.Subject, h.Key.Route, h.Key.Region, c.Int(h.Active), c.Int(h.Latest)}
}

func scanHead(sc scanner) (ledger.PolicyHead, error) {
	var (
		h              ledger.PolicyHead
		c              codec.Conv
		active, latest int64
	)
	if err := sc.Scan(&h.Key.Subject, &h.Key.Route, &h.Key.Region, &active, &latest); err != nil {
		return h, err
	}
	h.Active, h.Latest = c.Uint(active), c.Uint(latest)
	return h, c.Err()
}

func accountArgs(a *ledger.Account, c *codec.Conv) []any {
	// Room for the 12 values and accountPutArgs' epoch_indexed.
	return appendAccountArgs(make([]any, 0, 13), a, c)
}

// appendAccountArgs appends accountArgs(a, c) to args without making a
// slice of its own (a multi-row statement binds every row into one).
func appendAccountArgs(args []any, a *ledger.Account, c *codec.Conv) []any {
	refilled := ledger.Amounts(a.RefilledTo)
	return append(args, a.Key.Subject, a.Key.Route, a.Key.Region, c.Int(a.Key.Generation), int64(a.Dims),
		codec.EncodeBalances(&a.Balances), c.Nanos(a.EpochStart), codec.EncodeBalances(&a.EpochOpening),
		codec.EncodeAmounts(&refilled), a.Breaches, c.Int(a.Version), heldElsewhereArg(&a.HeldElsewhere))
}

// heldElsewhereArg binds an account's held_elsewhere (schema version 23):
// NULL when it counts nothing, as every account that is not its
// subject's current one, and every row written before the column.
func heldElsewhereArg(held *ledger.Amounts) any {
	if *held == (ledger.Amounts{}) {
		return nil
	}
	return codec.EncodeAmounts(held)
}

// heldElsewhereOf decodes held_elsewhere: NULL is 0 in every dimension.
func heldElsewhereOf(c *codec.Conv, src []byte) ledger.Amounts {
	if src == nil {
		return ledger.Amounts{}
	}
	return c.Amounts(src)
}

func scanAccount(sc scanner) (ledger.Account, error) {
	var (
		a                                  ledger.Account
		c                                  codec.Conv
		generation, dims, epochStart, ver  int64
		balances, epochOpening, refilledTo []byte
		held                               []byte
	)
	err := sc.Scan(&a.Key.Subject, &a.Key.Route, &a.Key.Region, &generation, &dims, &balances, &epochStart,
		&epochOpening, &refilledTo, &a.Breaches, &ver, &held)
	if err != nil {
		return a, err
	}
	a.Key.Generation = c.Uint(generation)
	a.Dims = c.Dims(dims)
	a.Balances = c.Balances(balances)
	a.EpochStart = c.Time(epochStart)
	a.EpochOpening = c.Balances(epochOpening)
	a.RefilledTo = c.Amounts(refilledTo)
	a.Version = c.Uint(ver)
	a.HeldElsewhere = heldElsewhereOf(&c, held)
	return a, c.Err()
}

func currentArgs(subject ledger.PolicyKey, generation uint64, c *codec.Conv) []any {
	return []any{subject.Subject, subject.Route, subject.Region, c.Int(generation)}
}

// dueAt returns the due_at column of r: when it became due for a worker,
// or nil when no worker will ever need it.
func dueAt(r *ledger.Reservation, c *codec.Conv) any {
	switch r.State {
	case ledger.StateReserved, ledger.StateExpiring:
		return c.Nanos(r.ExpiresAt)
	case ledger.StateStarted:
		if !r.ExecutionDeadline.IsZero() {
			return c.Nanos(r.ExecutionDeadline)
		}
	}
	return nil
}

func reservationArgs(r *ledger.Reservation, c *codec.Conv) []any {
	return appendReservationArgs(make([]any, 0, 20), r, c)
}

func appendReservationArgs(dst []any, r *ledger.Reservation, c *codec.Conv) []any {
	return append(dst, r.ID, r.RequestDigest, r.Account.Subject, r.Account.Route, r.Account.Region, c.Int(r.Account.Generation),
		c.Nanos(r.AccountingEpoch), codec.EncodeAmounts(&r.Reserved), codec.EncodeAmounts(&r.Actual),
		codec.EncodeAmounts(&r.Overdraft), r.OperationID, int64(r.State), c.Nanos(r.CreatedAt), c.Nanos(r.ExpiresAt),
		c.Nanos(r.StartedAt), c.Nanos(r.ExecutionDeadline), c.Nanos(r.UnknownAt), c.Nanos(r.FinishedAt), c.Bool(r.Breach),
		dueAt(r, c))
}

// fresh reports whether r is what a reserve inserts: RESERVED, with
// nothing started, settled or overdrawn, so wFreshReservationRows can
// write it.
func fresh(r *ledger.Reservation) bool {
	return r.State == ledger.StateReserved && r.Actual == (ledger.Amounts{}) && r.Overdraft == (ledger.Amounts{}) &&
		r.OperationID == "" && r.StartedAt.IsZero() && r.ExecutionDeadline.IsZero() && r.UnknownAt.IsZero() &&
		r.FinishedAt.IsZero() && !r.Breach
}

// appendFreshReservationArgs appends the columns of freshColumns (due_at
// of a RESERVED row is its expires_at, see dueAt).
func appendFreshReservationArgs(dst []any, r *ledger.Reservation, c *codec.Conv) []any {
	expires := any(c.Nanos(r.ExpiresAt)) // boxed once for both columns
	return append(dst, r.ID, r.RequestDigest, r.Account.Subject, r.Account.Route, r.Account.Region, c.Int(r.Account.Generation),
		c.Nanos(r.AccountingEpoch), codec.EncodeAmounts(&r.Reserved), c.Nanos(r.CreatedAt), expires, expires)
}

// appendFreshSharedArgs appends the per-row columns of freshSharedRow.
func appendFreshSharedArgs(dst []any, r *ledger.Reservation, _ *codec.Conv) []any {
	return append(dst, r.ID, r.RequestDigest, codec.EncodeAmounts(&r.Reserved))
}

func scanReservation(sc scanner) (ledger.Reservation, error) {
	var (
		r                                                   ledger.Reservation
		c                                                   codec.Conv
		generation, epoch, state, created, expires, started int64
		deadline, unknown, finished                         int64
		reserved, actual, overdraft                         []byte
	)
	err := sc.Scan(&r.ID, &r.RequestDigest, &r.Account.Subject, &r.Account.Route, &r.Account.Region, &generation,
		&epoch, &reserved, &actual, &overdraft, &r.OperationID, &state, &created, &expires, &started, &deadline,
		&unknown, &finished, &r.Breach)
	if err != nil {
		return r, err
	}
	r.Account.Generation = c.Uint(generation)
	r.AccountingEpoch = c.Time(epoch)
	r.Reserved, r.Actual, r.Overdraft = c.Amounts(reserved), c.Amounts(actual), c.Amounts(overdraft)
	r.State = c.State(state)
	r.CreatedAt, r.ExpiresAt, r.StartedAt = c.Time(created), c.Time(expires), c.Time(started)
	r.ExecutionDeadline, r.UnknownAt, r.FinishedAt = c.Time(deadline), c.Time(unknown), c.Time(finished)
	return r, c.Err()
}

func moveArgs(m *ledger.Move, c *codec.Conv) []any {
	return []any{m.ReceiptID, int64(m.Kind), m.From.Subject, m.From.Route, m.From.Region, c.Int(m.From.Generation),
		m.To.Subject, m.To.Route, m.To.Region, c.Int(m.To.Generation), codec.EncodeAmounts(&m.Units),
		codec.EncodeAmounts(&m.Debt), c.Nanos(m.At)}
}

func scanMove(sc scanner) (ledger.Move, error) {
	var (
		m                        ledger.Move
		c                        codec.Conv
		kind, fromGen, toGen, at int64
		units, debt              []byte
	)
	err := sc.Scan(&m.ReceiptID, &kind, &m.From.Subject, &m.From.Route, &m.From.Region, &fromGen,
		&m.To.Subject, &m.To.Route, &m.To.Region, &toGen, &units, &debt, &at)
	if err != nil {
		return m, err
	}
	m.Kind = c.MoveKind(kind)
	m.From.Generation, m.To.Generation = c.Uint(fromGen), c.Uint(toGen)
	m.Units, m.Debt = c.Amounts(units), c.Amounts(debt)
	m.At = c.Time(at)
	return m, c.Err()
}

func shardArgs(s *ledger.Shard, c *codec.Conv) []any {
	if len(s.Signature) > codec.MaxSignatureLen {
		// Refuse on the way in what DecodeSignature would refuse on the way
		// out, so an unreadable row is never written.
		c.Signature(s.Signature)
	}
	return []any{s.ID, s.Account.Subject, s.Account.Route, s.Account.Region, c.Int(s.Account.Generation), s.GatewayID,
		c.Int(s.BootEpoch), c.Int(s.Fence), codec.EncodeShardAmounts(s), c.Nanos(s.IssuedAt), c.Nanos(s.ExpiresAt),
		s.KeyID, codec.EncodeSignature(s.Signature), c.Bool(s.Reconciled)}
}

func scanShard(sc scanner) (ledger.Shard, error) {
	var (
		s                                        ledger.Shard
		c                                        codec.Conv
		generation, boot, fence, issued, expires int64
		amounts, signature                       []byte
	)
	err := sc.Scan(&s.ID, &s.Account.Subject, &s.Account.Route, &s.Account.Region, &generation, &s.GatewayID, &boot,
		&fence, &amounts, &issued, &expires, &s.KeyID, &signature, &s.Reconciled)
	if err != nil {
		return s, err
	}
	s.Account.Generation = c.Uint(generation)
	s.BootEpoch, s.Fence = c.Uint(boot), c.Uint(fence)
	c.ShardAmounts(amounts, &s)
	s.IssuedAt, s.ExpiresAt = c.Time(issued), c.Time(expires)
	s.Signature = c.Signature(signature)
	return s, c.Err()
}

// appendStatementArgs appends a statement's statementCols (wStatementRows).
func appendStatementArgs(dst []any, s *ledger.Statement, c *codec.Conv) []any {
	return append(dst, s.Account.Subject, s.Account.Route, s.Account.Region, c.Int(s.Account.Generation),
		c.Nanos(s.EpochStart), c.Nanos(s.EpochEnd), int64(c.Dims(int64(s.Dims))), codec.EncodeBalances(&s.Opening),
		codec.EncodeBalances(&s.Closing))
}

func scanStatement(sc scanner) (ledger.Statement, error) {
	var (
		s                      ledger.Statement
		c                      codec.Conv
		generation, start, end int64
		dims                   int64
		opening, closing       []byte
	)
	err := sc.Scan(&s.Account.Subject, &s.Account.Route, &s.Account.Region, &generation, &start, &end, &dims,
		&opening, &closing)
	if err != nil {
		return s, err
	}
	s.Account.Generation = c.Uint(generation)
	s.EpochStart, s.EpochEnd = c.Time(start), c.Time(end)
	s.Dims = c.Dims(dims)
	s.Opening, s.Closing = c.Balances(opening), c.Balances(closing)
	return s, c.Err()
}

// scanJournal reads a row of the journal table, which schema versions 1
// and 2 wrote (one row per entry); later versions write journal_batches.
func scanJournal(sc scanner) (ledger.JournalEntry, error) {
	var (
		e                              ledger.JournalEntry
		c                              codec.Conv
		at, kind, generation, from, to int64
		delta                          []byte
	)
	err := sc.Scan(&at, &kind, &e.Account.Subject, &e.Account.Route, &e.Account.Region, &generation,
		&e.ReservationID, &from, &to, &e.ReceiptID, &delta)
	if err != nil {
		return e, err
	}
	e.At = c.Time(at)
	e.Kind = c.Kind(kind)
	e.Account.Generation = c.Uint(generation)
	e.From, e.To = c.State(from), c.State(to)
	e.Delta = c.Balances(delta)
	return e, c.Err()
}
