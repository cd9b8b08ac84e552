package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/capledger/capledger/store"
)

// writer is the store's one write connection, used through the driver's
// own interface rather than database/sql: a batch runs a few dozen
// statements on it, and database/sql's per-statement work (argument
// conversion, locking, a Stmt per transaction, a goroutine watching each
// transaction's context) cost as much as the statements. Only the Tx
// holding Store.writer uses it, so it needs no lock of its own.
type writer struct {
	conn  driver.Conn
	stmts [nWriteStmts]driver.Stmt
	// begin, commit and rollback are prepared too: the driver would parse
	// them on every transaction.
	begin, commit, rollback driver.Stmt
	// args is reused for every statement's arguments.
	args []driver.NamedValue
	// journalBuf is reused for every Write's journal batch, rowArgs for
	// the arguments of multi-row INSERTs.
	journalBuf []byte
	rowArgs    []any
	// extra holds statements prepared on first use (retention.go).
	extra map[string]driver.Stmt
	// totalChanges is total_changes() as changedRows last read it, valid
	// once totalChangesRead (pipeline.go).
	totalChanges     int64
	totalChangesRead bool

	closeOnce sync.Once
	closeErr  error
}

// PRAGMA synchronous values: FULL fsyncs the WAL in every COMMIT; NORMAL
// leaves that to a checkpoint or to Store.Sync (pipeline.go).
const (
	syncNormal int64 = 1
	syncFull   int64 = 2
)

// openWriter opens the write connection through connector, checks that
// it runs with synchronous wantSync and prepares every write statement on
// it.
func openWriter(ctx context.Context, connector driver.Connector, wantSync int64) (*writer, error) {
	conn, err := connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	w := &writer{conn: conn}
	prepare := func(q string) (driver.Stmt, error) {
		st, err := conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("prepare %q: %w", q, err)
		}
		return st, nil
	}
	var errs []error
	for i, q := range writeSQL {
		w.stmts[i], err = prepare(q)
		errs = append(errs, err)
	}
	w.begin, err = prepare("BEGIN IMMEDIATE")
	errs = append(errs, err)
	w.commit, err = prepare("COMMIT")
	errs = append(errs, err)
	w.rollback, err = prepare("ROLLBACK")
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		w.close()
		return nil, err
	}
	// synchronous is per connection: check this one's, which every
	// acknowledged commit relies on (with Store.Sync when it is NORMAL).
	check, err := prepare("PRAGMA synchronous")
	if err == nil {
		var sync int64
		sync, err = queryOneRow(ctx, w, check, nil, scanInt)
		check.Close()
		if err == nil && sync != wantSync {
			err = fmt.Errorf("synchronous is %d, not %d", sync, wantSync)
		}
	}
	if err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// close closes the statements and the connection (which rolls back an open
// transaction) once; later calls return the first call's error.
func (w *writer) close() error {
	w.closeOnce.Do(func() {
		for _, st := range append(w.stmts[:], w.begin, w.commit, w.rollback) {
			if st != nil {
				st.Close()
			}
		}
		for _, st := range w.extra {
			st.Close()
		}
		w.closeErr = w.conn.Close()
	})
	return w.closeErr
}

// named returns args as the driver's arguments, in w.args. Every value the
// row functions produce is a driver.Value already (int64, float64, bool,
// string, []byte or nil); anything else goes through the default
// converter, as database/sql would.
func (w *writer) named(args []any) ([]driver.NamedValue, error) {
	w.args = w.args[:0]
	for i, a := range args {
		switch a.(type) {
		case int64, float64, bool, string, []byte, nil:
		default:
			v, err := driver.DefaultParameterConverter.ConvertValue(a)
			if err != nil {
				return nil, fmt.Errorf("argument %d: %w", i+1, err)
			}
			a = v
		}
		w.args = append(w.args, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	return w.args, nil
}

// exec runs statement st with args. ctx must not be cancellable (see
// stmtCtx): the driver would start a goroutine to watch it.
func (w *writer) exec(ctx context.Context, st driver.Stmt, args []any) error {
	nv, err := w.named(args)
	if err != nil {
		return err
	}
	_, err = st.(driver.StmtExecContext).ExecContext(ctx, nv)
	return err
}

// execCount runs statement st with args and returns the rows it changed.
func (w *writer) execCount(ctx context.Context, st driver.Stmt, args []any) (int64, error) {
	nv, err := w.named(args)
	if err != nil {
		return 0, err
	}
	res, err := st.(driver.StmtExecContext).ExecContext(ctx, nv)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// query runs statement st with args and calls row for every row, with a
// scanner over it.
func (w *writer) query(ctx context.Context, st driver.Stmt, args []any, row func(scanner) error) error {
	nv, err := w.named(args)
	if err != nil {
		return err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(ctx, nv)
	if err != nil {
		return err
	}
	defer rows.Close()
	values := make([]driver.Value, len(rows.Columns()))
	for {
		if err := rows.Next(values); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := row(driverRow(values)); err != nil {
			return err
		}
	}
}

// queryOne runs st with args and scans its one row with scan; no row is
// store.ErrNotFound.
func queryOneRow[T any](ctx context.Context, w *writer, st driver.Stmt, args []any, scan func(scanner) (T, error)) (T, error) {
	var v T
	found := false
	err := w.query(ctx, st, args, func(sc scanner) error {
		if found {
			return nil
		}
		var err error
		v, err = scan(sc)
		found = err == nil
		return err
	})
	if err == nil && !found {
		err = store.ErrNotFound
	}
	return v, err
}

// driverRow is one row as the driver returned it, scanned into the types
// the row functions use, as database/sql's Scan would.
type driverRow []driver.Value

func (r driverRow) Scan(dest ...any) error {
	if len(dest) != len(r) {
		return fmt.Errorf("scan: %d destinations for %d columns", len(dest), len(r))
	}
	for i, d := range dest {
		v := r[i]
		var ok bool
		switch d := d.(type) {
		case *string:
			switch v := v.(type) {
			case string:
				*d, ok = v, true
			case []byte:
				*d, ok = string(v), true
			}
		case *int64:
			*d, ok = v.(int64)
		case *float64:
			switch v := v.(type) {
			case float64:
				*d, ok = v, true
			case int64:
				*d, ok = float64(v), true
			}
		case *bool:
			var n int64
			if n, ok = v.(int64); ok {
				*d = n != 0
			}
		case *[]byte:
			switch v := v.(type) {
			case []byte:
				*d, ok = append([]byte(nil), v...), true
			case string:
				*d, ok = []byte(v), true
			case nil:
				*d, ok = nil, true
			}
		}
		if !ok {
			return fmt.Errorf("scan column %d: cannot store %T in %T", i, v, d)
		}
	}
	return nil
}
