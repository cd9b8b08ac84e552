package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// This file is what protocol adapters beside the server (envoyrls) use, so
// that a foreign protocol reaches the ledger by the very path the
// LedgerService handlers take: the same unit mapping by the cached policy,
// the same stale-generation retry, the same error classification, the same
// metrics and the same auth. An adapter translates; it decides nothing the
// handlers would decide otherwise.

// Mount serves h under pattern on the server's port, behind the same body
// limit as the LedgerService. Call it before serving.
func (s *Server) Mount(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// HandlerOptions returns the connect options the LedgerService is served
// with (message size limit, compression threshold, and the bearer-token
// auth interceptor when auth is on), for a handler mounted with Mount.
func (s *Server) HandlerOptions() []connect.HandlerOption { return s.options }

// ReserveCommand validates req and maps its units by the policy the server
// believes decides, exactly as Reserve does. invalid is a refusal decided
// before the ledger (the caller answers it); unmapped is set when the units
// could not be mapped but the id exists, so the ledger is to answer a
// replay (see reserveCommand).
func (s *Server) ReserveCommand(ctx context.Context, req *v1.ReserveRequest) (cmd ledger.Command, unmapped, invalid *connect.Error) {
	return s.reserveCommand(ctx, req)
}

// SettleCommand validates req and maps its units by the reservation's own
// generation, exactly as Settle does.
func (s *Server) SettleCommand(ctx context.Context, req *v1.SettleRequest) (ledger.Command, *connect.Error) {
	return s.settleCommand(ctx, req)
}

// Run applies cmds in order in one engine call (one store transaction when
// they fit one batch). The error is an operating failure (store
// unavailable, shutting down; the outcome is then unknown), mapped as on
// every LedgerService method. Run counts nothing: the caller adds the
// results it answers by, or the failure, to its call's Answers.
func (s *Server) Run(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, *connect.Error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	results, err := s.ledger.DoBatch(ctx, cmds)
	if err != nil {
		return nil, operatingError(cmds[0].Kind.String(), err)
	}
	return results, nil
}

// Answers collects the outcomes of one adapter call's commands for
// capledger_commands_total, counted once the call's own answer is known
// (CountAnswers), so that each command counts once, with the outcome its
// caller saw: a result the adapter does not answer by (a stale refusal,
// mapped again) is never added, and a call that fails on an operating
// failure counts every command it added as unavailable, as a batch that
// fails whole counts its items. The zero value is ready; one call's
// handful of commands needs no allocation.
type Answers struct {
	first [8]answer
	n     int
	more  []answer
	// rejections are the capacity rejections the call answers by
	// (Rejected), counted in capledger_rejections_total with the
	// commands.
	rejections []rejected
}

type rejected struct {
	dimension, reason string
	shadow            bool
}

// Rejected adds res, a capacity rejection the call answers by (enforced,
// or a shadow policy's would-be rejection that let the request through),
// to capledger_rejections_total, counted by CountAnswers once the call's
// answer is known: a call that answers an error (a descriptor's outcome
// that fails the call, an operating failure) counts none, since its
// caller saw no rejection.
func (a *Answers) Rejected(res *ledger.Result) {
	a.rejections = append(a.rejections, rejected{dimension: res.Dimension, reason: classify(res.Err).reason, shadow: res.Shadow})
}

type answer struct {
	kind    ledger.Kind
	outcome string
}

func (a *Answers) add(kind ledger.Kind, outcome string) {
	if a.n < len(a.first) {
		a.first[a.n] = answer{kind: kind, outcome: outcome}
		a.n++
		return
	}
	a.more = append(a.more, answer{kind: kind, outcome: outcome})
}

// Results adds the results of cmds, one engine call's (Run), but for
// follow-ups of a command of the same call that failed (followsRefusal):
// the refusal is counted, not the start or settle that found nothing.
func (a *Answers) Results(cmds []ledger.Command, results []ledger.Result) {
	for i := range results {
		if !followsRefusal(cmds, results, i) {
			a.add(cmds[i].Kind, outcomeLabel(&results[i]))
		}
	}
}

// Failed adds cmds, one engine call that failed (Run's error), as
// unavailable.
func (a *Answers) Failed(cmds []ledger.Command) {
	for i := range cmds {
		a.add(cmds[i].Kind, outcomeUnavailable)
	}
}

// Refused adds a command of kind refused before the ledger, under the
// outcome of its refusal.
func (a *Answers) Refused(kind ledger.Kind, cerr *connect.Error) {
	a.add(kind, refusalOutcome(cerr))
}

// RefusedNoPolicy adds a command refused before the ledger because what
// it names maps to no policy at all (an adapter's request that matches
// none of its mapping rules), under the outcome a reserve without an
// active policy gets.
func (a *Answers) RefusedNoPolicy(kind ledger.Kind) {
	a.add(kind, strings.ToLower(ReasonNoPolicy))
}

// CountAnswers counts a's commands in capledger_commands_total once the
// call answered err (nil on success): each under its own outcome, or all
// as unavailable when err is an operating failure (the caller saw none of
// their answers and retries them all).
func (s *Server) CountAnswers(a *Answers, err error) {
	var cerr *connect.Error
	failed := errors.As(err, &cerr) && operatingFailure(cerr)
	count := func(answered answer) {
		if failed {
			answered.outcome = outcomeUnavailable
		}
		s.metrics.command(answered.kind, answered.outcome)
	}
	for _, answered := range a.first[:a.n] {
		count(answered)
	}
	for _, answered := range a.more {
		count(answered)
	}
	if err == nil {
		for _, r := range a.rejections {
			s.countRejection(r.dimension, r.reason, r.shadow)
		}
	}
}

// followsRefusal reports whether cmds[i] is a follow-up (a start or settle
// of a check) of an earlier command of the same call, on the same
// reservation, that failed: it found no reservation because that one was
// refused, and is not counted as a command of its own (the refusal is).
func followsRefusal(cmds []ledger.Command, results []ledger.Result, i int) bool {
	if results[i].Err == nil {
		return false
	}
	for j := range i {
		if results[j].Err != nil && cmds[j].ReservationID == cmds[i].ReservationID {
			return true
		}
	}
	return false
}

// RefreshPolicies brings the policy cache to what the ledger said decides
// (res, its answer to cmd, a reserve or record refused as mapped for
// another generation: Stale).
func (s *Server) RefreshPolicies(ctx context.Context, cmd *ledger.Command, res *ledger.Result) *connect.Error {
	if err := s.policies.refreshStale(ctx, ledger.PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}, res.Generation); err != nil {
		return readError("policies", ReasonNoPolicy, err)
	}
	return nil
}

// Policy returns generation's policy from the cache (or the store).
func (s *Server) Policy(ctx context.Context, generation uint64) (ledger.Policy, *connect.Error) {
	p, err := s.policies.get(ctx, generation)
	if err != nil {
		return p, readError("policy", ReasonPolicyNotFound, err)
	}
	return p, nil
}

// pagePolicies are the policies of a page of accounts' generations, read
// together (with the accounts: store.AccountsView), for a handler that
// shows each account.
type pagePolicies struct {
	s            *Server
	byGeneration map[uint64]ledger.Policy
}

// get returns generation's policy as read with the page; one it did not
// find is asked again (Policy), which names it when it does not exist.
func (pp pagePolicies) get(ctx context.Context, generation uint64) (ledger.Policy, *connect.Error) {
	if p, ok := pp.byGeneration[generation]; ok {
		return p, nil
	}
	return pp.s.Policy(ctx, generation)
}

// shownPolicy returns the policy of the account of key as it was shown
// with (engine.ShownWith: read in one snapshot with its balances); one
// not there (never, from the engine's views) is asked again (Policy).
func (s *Server) shownPolicy(ctx context.Context, with engine.ShownWith, key ledger.AccountKey) (ledger.Policy, *connect.Error) {
	if p, ok := with.Policy(key); ok {
		return p, nil
	}
	return s.Policy(ctx, key.Generation)
}

// Account returns the current account of the concrete subject key under
// generation, as the store holds it after the last commit; ok is false when
// there is none yet.
func (s *Server) Account(ctx context.Context, key ledger.PolicyKey, generation uint64) (ledger.Account, bool, *connect.Error) {
	accounts, err := s.ledger.Accounts(ctx, key)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return ledger.Account{}, false, nil
		}
		return ledger.Account{}, false, readError("account "+key.String(), ReasonAccountNotFound, err)
	}
	var best *ledger.Account
	for i := range accounts {
		a := &accounts[i]
		if a.Key.SubjectKey() != key || a.Key.Generation != generation {
			continue
		}
		if best == nil || a.EpochStart.After(best.EpochStart) {
			best = a
		}
	}
	if best == nil {
		return ledger.Account{}, false, nil
	}
	return *best, true, nil
}

// Stale reports whether the ledger refused a reserve because another
// generation decides than the one its units were mapped for; the caller
// refreshes the policies and maps the reserve again (at most StaleRetries
// times).
func Stale(cmd *ledger.Command, res *ledger.Result) bool { return stale(cmd, res) }

// StaleRetries bounds the remapping of a stale reserve.
const StaleRetries = staleRetries

// StaleError is the answer to a command (what names it) that the ledger
// still refused as stale (res) after StaleRetries remappings, as every
// LedgerService method answers it: 503 unavailable, STORE_CONFLICT, "not
// applied", retry with the same ids.
func StaleError(what string, res *ledger.Result) *connect.Error { return staleError(what, res) }

// Outcome is the wire meaning of one ledger outcome: the status code, the
// reason of ErrorDetail / RejectionDetail, and whether it is a capacity
// rejection (RESOURCE_EXHAUSTED, 429).
type Outcome struct {
	Code     connect.Code
	Reason   string
	Capacity bool
}

// Classify returns the wire meaning of a ledger error, as every
// LedgerService method maps it.
func Classify(err error) Outcome {
	c := classify(err)
	return Outcome{Code: c.code, Reason: c.reason, Capacity: c.capacity}
}

func (s *Server) countRejection(dimension, reason string, shadow bool) {
	if shadow {
		s.metrics.shadowRejection(dimension, reason)
		return
	}
	s.metrics.rejection(dimension, reason)
}

// RetryAfterSeconds rounds a wait up to whole seconds, as the Retry-After
// header of a 429 does (ledger.WholeSeconds).
func RetryAfterSeconds(d time.Duration) time.Duration { return ledger.WholeSeconds(d) }

// RequestDigest is the digest the server derives for a reserve that names
// none (the canonical request digest over subject, route, region, units).
func RequestDigest(subject, route, region string, units map[string]int64) string {
	return requestDigest(subject, route, region, units)
}
