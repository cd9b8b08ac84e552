package engine

import (
	"context"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The resolver's last answer per USAGE_UNKNOWN reservation, by account
// and reservation id, kept in the store (store.ResolverAnswers) when the
// store keeps them: every replica
// can then show it (ConsoleService.GetResolverAnswers), and a resolver
// that starts (a restart, a new worker leader) goes on with the backoff
// the last one reached instead of asking every gateway again at once.

// The answers recorded beside OperationState's names.
const (
	// AnswerError: no verified answer (a timeout, a refused connection,
	// a 5xx, garbage), or a settle whose outcome is unknown.
	AnswerError = "error"
	// AnswerNoEndpoint: the route has no operation-status endpoint.
	AnswerNoEndpoint = "no_endpoint"
	// AnswerSettleRefused: an answer that cannot settle (a unit the
	// policy does not limit) or a settle the ledger refused.
	AnswerSettleRefused = "settle_refused"
)

// answerStore returns the store's ResolverAnswers, nil when it keeps none.
func (r *Resolver) answerStore() store.ResolverAnswers {
	a, _ := r.store.(store.ResolverAnswers)
	return a
}

// storedAnswers returns the stored answers of the rows this resolver has
// no attempt for yet, by account and reservation id; none when the store
// keeps none or cannot be read (the resolver then starts them afresh).
// An answer of another account under a row's id is none of the row's
// (store.ResolverAnswer): the store leaves it out, and so does this
// (the row was read before the store's answer).
func (r *Resolver) storedAnswers(ctx context.Context, rows []ledger.Reservation) map[unknownKey]store.ResolverAnswer {
	as := r.answerStore()
	if as == nil {
		return nil
	}
	var ids []string
	r.mu.Lock()
	for i := range rows {
		if r.attempts[keyOf(&rows[i])] == nil {
			ids = append(ids, rows[i].ID)
		}
	}
	r.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	list, err := as.ResolverAnswersGet(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			r.fails.failed("resolver: read stored answers", err)
		}
		return nil
	}
	r.fails.ok("resolver: read stored answers")
	out := make(map[unknownKey]store.ResolverAnswer, len(list))
	for _, a := range list {
		out[unknownKey{a.Account, a.ReservationID}] = a
	}
	return out
}

// recordAnswers stores what each of due heard (heard[i], empty for one
// that settled or was not asked) with its attempt count and next
// question, asked at now.
func (r *Resolver) recordAnswers(ctx context.Context, due []*ledger.Reservation, heard []store.ResolverAnswer, now time.Time) {
	as := r.answerStore()
	if as == nil {
		return
	}
	var put []store.ResolverAnswer
	r.mu.Lock()
	for i, row := range due {
		a := r.attempts[keyOf(row)]
		if heard[i].Answer == "" || a == nil {
			continue
		}
		rec := heard[i]
		rec.Account, rec.ReservationID = row.Account, row.ID
		rec.AskedAt, rec.Attempts, rec.NextAt = now, int64(a.polls), a.next
		put = append(put, rec)
	}
	r.mu.Unlock()
	if len(put) == 0 {
		return
	}
	switch err := as.ResolverAnswersPut(ctx, put); {
	case err == nil:
		r.fails.ok("resolver: record answers")
	case ctx.Err() == nil:
		r.fails.failed("resolver: record answers", err, "answers", len(put))
	}
}

// pruneAnswers deletes the stored answers of reservations that left
// USAGE_UNKNOWN, once per pass over the backlog.
func (r *Resolver) pruneAnswers(ctx context.Context) {
	as := r.answerStore()
	if as == nil {
		return
	}
	switch _, err := as.ResolverAnswersPrune(ctx); {
	case err == nil:
		r.fails.ok("resolver: prune answers")
	case ctx.Err() == nil:
		r.fails.failed("resolver: prune answers", err)
	}
}
