package memstore

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.ConsoleStore = (*Store)(nil)

// consoleRows are the rows of store.ConsoleStore that are not the
// ledger's: written outside the ledger's transactions, like rollouts.
type consoleRows struct {
	answers map[answerKey]store.ResolverAnswer
	audits  map[string]store.AuditRecord
}

// write runs f on the committed rows under the write lock.
func (s *Store) write(ctx context.Context, f func(r *rows) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	return f(s.committed)
}

// answerKey is what a resolver answer is stored under: its account and
// its reservation id (store.ResolverAnswer).
type answerKey struct {
	account ledger.AccountKey
	id      string
}

func keyOfAnswer(a *store.ResolverAnswer) answerKey { return answerKey{a.Account, a.ReservationID} }

// ResolverAnswersPut upserts answers by (account, reservation id).
func (s *Store) ResolverAnswersPut(ctx context.Context, answers []store.ResolverAnswer) error {
	for _, a := range answers {
		if err := storableAnswer(&a); err != nil {
			return err
		}
	}
	return s.write(ctx, func(r *rows) error {
		if r.console.answers == nil {
			r.console.answers = map[answerKey]store.ResolverAnswer{}
		}
		for _, a := range answers {
			a.AskedAt, a.NextAt = stored(a.AskedAt), stored(a.NextAt)
			r.console.answers[keyOfAnswer(&a)] = a
		}
		return nil
	})
}

// currentUnknown returns the USAGE_UNKNOWN reservation id names now,
// nil when there is none.
func (r *rows) currentUnknown(id string) *ledger.Reservation {
	if !r.unknown[id] {
		return nil
	}
	return r.reservations[id]
}

// storableTime refuses a time the SQL stores cannot hold, as they do.
func storableTime(t time.Time) error {
	var conv codec.Conv
	conv.Nanos(t)
	return conv.Err()
}

// stored returns t as a store reads it back: UTC, exact to the nanosecond.
func stored(t time.Time) time.Time {
	var conv codec.Conv
	return conv.Time(conv.Nanos(t))
}

// storableAnswer refuses what the SQL stores cannot hold.
func storableAnswer(a *store.ResolverAnswer) error {
	if err := a.Check(); err != nil {
		return err
	}
	if err := storableTime(a.AskedAt); err != nil {
		return fmt.Errorf("resolver answer of %s: %w", a.ReservationID, err)
	}
	if err := storableTime(a.NextAt); err != nil {
		return fmt.Errorf("resolver answer of %s: %w", a.ReservationID, err)
	}
	return nil
}

// ResolverAnswersGet returns the answers of ids whose reservation is
// USAGE_UNKNOWN, each only if it is of that reservation's account, in
// the order of ids.
func (s *Store) ResolverAnswersGet(ctx context.Context, ids []string) (out []store.ResolverAnswer, err error) {
	err = s.read(ctx, func(r *rows) error {
		answered := map[string]bool{}
		for _, id := range ids {
			res := r.currentUnknown(id)
			if res == nil || answered[id] {
				continue
			}
			if a, ok := r.console.answers[answerKey{res.Account, id}]; ok {
				out = append(out, a)
				answered[id] = true // an id asked twice is answered once
			}
		}
		return nil
	})
	return out, err
}

// ResolverAnswersPrune deletes the answers that are not of a
// USAGE_UNKNOWN reservation of their account.
func (s *Store) ResolverAnswersPrune(ctx context.Context) (n int, err error) {
	err = s.write(ctx, func(r *rows) error {
		for k := range r.console.answers {
			if res := r.currentUnknown(k.id); res == nil || res.Account != k.account {
				delete(r.console.answers, k)
				n++
			}
		}
		return nil
	})
	return n, err
}

// ReservationsOfSubject returns the subject's reservations newest first.
// The in-memory store scans every reservation: it serves tests and the
// simulator, not large ledgers.
func (s *Store) ReservationsOfSubject(ctx context.Context, f store.SubjectFilter) (out []ledger.Reservation, err error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	states := map[ledger.State]bool{}
	for _, st := range f.StatesList() {
		states[st] = true
	}
	err = s.read(ctx, func(r *rows) error {
		for _, res := range r.reservations {
			if res.Account.Subject == f.Subject && states[res.State] && f.Before.Admits(res) {
				out = append(out, *res)
			}
		}
		return nil
	})
	slices.SortFunc(out, store.NewestFirst)
	return out[:min(f.Limit, len(out))], err
}

// ReservationStatesOfSubject counts the subject's reservations by route
// and state, and what retention removed from each of its accounts.
func (s *Store) ReservationStatesOfSubject(ctx context.Context, subject string) (out store.SubjectStates, err error) {
	type routeState struct {
		route string
		state ledger.State
	}
	counts := map[routeState]int64{}
	err = s.read(ctx, func(r *rows) error {
		for _, res := range r.reservations {
			if res.Account.Subject == subject {
				counts[routeState{res.Account.Route, res.State}]++
			}
		}
		for key, ret := range r.ret.retained {
			if key.Subject == subject && ret.Reservations > 0 {
				out.Retained = append(out.Retained, store.RetainedCount{Account: key, Reservations: ret.Reservations})
			}
		}
		return nil
	})
	for k, n := range counts {
		out.Counts = append(out.Counts, store.StateCount{Route: k.route, State: k.state, Count: n})
	}
	slices.SortFunc(out.Counts, func(a, b store.StateCount) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.State, b.State))
	})
	slices.SortFunc(out.Retained, func(a, b store.RetainedCount) int { return a.Account.Compare(b.Account) })
	return out, err
}

// StatementsOf returns the account's statements, the latest epoch first.
func (s *Store) StatementsOf(ctx context.Context, f store.StatementFilter) (out []ledger.Statement, err error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("statements of %s: limit %d is not positive", f.Account, f.Limit)
	}
	err = s.read(ctx, func(r *rows) error {
		for _, st := range r.statements {
			if st.Account == f.Account && (f.Before.IsZero() || st.EpochStart.Before(f.Before)) {
				out = append(out, st)
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b ledger.Statement) int { return b.EpochStart.Compare(a.EpochStart) })
	return out[:min(f.Limit, len(out))], err
}

// AuditRecordPut records rec as the last (and, clean, the last clean)
// audit unless a later one is recorded.
func (s *Store) AuditRecordPut(ctx context.Context, rec *store.AuditRecord) error {
	if err := storableTime(rec.At); err != nil {
		return fmt.Errorf("audit record: %w", err)
	}
	kept := *rec
	kept.At = stored(rec.At)
	kept.Checks = maps.Clone(rec.Checks)
	return s.write(ctx, func(r *rows) error {
		if r.console.audits == nil {
			r.console.audits = map[string]store.AuditRecord{}
		}
		names := []string{store.AuditRecordLast}
		if rec.Clean() {
			names = append(names, store.AuditRecordClean)
		}
		for _, name := range names {
			if old, ok := r.console.audits[name]; !ok || !old.At.After(kept.At) {
				r.console.audits[name] = kept
			}
		}
		return nil
	})
}

// AuditRecordsGet returns the last audit and the last clean one.
func (s *Store) AuditRecordsGet(ctx context.Context) (last, lastClean *store.AuditRecord, err error) {
	err = s.read(ctx, func(r *rows) error {
		if a, ok := r.console.audits[store.AuditRecordLast]; ok {
			a.Checks = maps.Clone(a.Checks)
			last = &a
		}
		if a, ok := r.console.audits[store.AuditRecordClean]; ok {
			a.Checks = maps.Clone(a.Checks)
			lastClean = &a
		}
		return nil
	})
	return last, lastClean, err
}
