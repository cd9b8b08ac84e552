package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
)

// EmergencyRunResult is the outcome of Emergency.Run: the RunResult, and
// Local when the request ran from a shard (Reservation is nil then).
type EmergencyRunResult struct {
	RunResult
	Local *LocalReceipt
}

// Run is Client.Run in partition mode: the request is reserved through the
// ledger, or from the subject's shard while the ledger is unreachable
// (Emergency.Reserve), and then started, run and settled wherever it was
// admitted, with Client.Run's rules: unstarted work is released, work whose
// usage is unknown (see Work) is marked USAGE_UNKNOWN, never refunded. A
// local USAGE_UNKNOWN is resolved by Settle with the receipt's operation
// id (it reaches the ledger at the shard's next Reconcile).
//
// Returns as Client.Run; the Reserve errors of Emergency.Reserve when
// nothing was admitted (for a retried id whose shard ended and was
// compacted away, an error wrapping ledger.ErrReservationRetired: the
// work is not run); the shard store's errors for local steps before
// the work ran. Once local work has run, every failure to settle it is a
// *UsageUnknownError with the receipt: the usage the shard refused
// (ErrInvalidCommand: its Receipt has no Actual), or, when the store
// could not record the settle (ErrShardStoreBroken), the receipt with
// the work's Actual and Marked false (the store could not mark it
// either). Such work is USAGE_UNKNOWN once the store is reopened (a
// restart inherits it; SETTLED if the write reached the disk though its
// sync failed) and Emergency.Settle with the receipt's operation id and
// Actual settles it (a replay if it was settled) before the shard is
// reconciled.
func (e *Emergency) Run(ctx context.Context, req ReserveRequest, work Work) (*EmergencyRunResult, error) {
	return e.run(ctx, req, work, nil)
}

func (e *Emergency) run(ctx context.Context, req ReserveRequest, work Work, g gate) (*EmergencyRunResult, error) {
	er, err := e.Reserve(ctx, req)
	if err != nil {
		return nil, err
	}
	if er.Central != nil {
		res, err := e.client.runReserved(ctx, er.Central, work, g)
		if res == nil {
			return nil, err
		}
		return &EmergencyRunResult{RunResult: *res}, err
	}
	local := er.Local
	id := local.ReservationID
	if local.State != ledger.StateReserved {
		if local.Retired {
			// A retry of a request whose shard ended and was compacted
			// away: its tombstone replays the reserve; wrap
			// ErrReservationRetired as every other tombstone answer does.
			return nil, fmt.Errorf("run %s: local reservation is %s, not RESERVED: %w", id, local.State, ledger.ErrReservationRetired)
		}
		return nil, ranAlreadyError(&ledgerv1.Reservation{ReservationId: id, Subject: req.Subject, Route: req.Route, State: stateProto(local.State)})
	}
	sh := e.store.shardOf(id)
	if sh == nil {
		// Its shard was reconciled and compacted away since the reserve
		// (sealing it released the hold).
		return nil, fmt.Errorf("run %s: %w: its shard was reconciled meanwhile", id, ledger.ErrShardSealed)
	}
	receipt := OperationReceipt{ReservationID: id, Subject: req.Subject, Route: req.Route, Region: sh.Account.Region,
		PolicyGeneration: sh.Account.Generation, Reserved: local.Reserved}
	done := func(Units) {}
	if g != nil {
		d, gerr := g(ctx, &ReserveResult{ReservationID: id, RequestDigest: local.RequestDigest, Generation: sh.Account.Generation,
			Reservation: &ledgerv1.Reservation{ReservationId: id, Subject: req.Subject, Route: req.Route, Region: sh.Account.Region,
				PolicyGeneration: sh.Account.Generation, ReservedUnits: local.Reserved}})
		if gerr != nil {
			e.store.Release(id)
			return nil, gerr
		}
		done = d
	}
	if err := ctx.Err(); err != nil {
		e.store.Release(id)
		done(nil)
		return nil, err
	}
	receipt.OperationID = NewOperationID()
	if _, err := e.store.Start(id, receipt.OperationID); err != nil {
		e.store.Release(id)
		done(nil)
		return nil, fmt.Errorf("run: %w", err)
	}
	receipt.StartedAt = time.Now()
	actual, werr, panicked, panicValue := runWork(context.WithValue(ctx, receiptKey{}, receipt), work)
	if panicked || errors.Is(werr, ErrUsageUnknown) || (actual == nil && isContextError(werr)) {
		cause := werr
		if panicked {
			cause = fmt.Errorf("work panicked: %v", panicValue)
		} else if cause == nil {
			cause = ErrUsageUnknown
		}
		uerr := e.markLocalUnknown(receipt, cause)
		done(receipt.Reserved)
		if panicked {
			panic(panicValue)
		}
		return nil, uerr
	}
	actual = usageToSettle(actual, receipt.Reserved)
	receipt.Actual = actual
	settled, serr := e.store.Settle(id, receipt.OperationID, actual)
	done(actual)
	if errors.Is(serr, ledger.ErrInvalidCommand) {
		// The shard cannot take the usage the work reported (a negative
		// amount, a unit it does not have): what it used is unknown, as
		// Client.Run decides for the ledger's refusal.
		receipt.Actual = nil
		return nil, e.markLocalUnknown(receipt, serr)
	}
	if serr != nil {
		// The store could not record the settle (a failed log write
		// breaks it until it is reopened): the work ran and its usage is
		// known, but the shard holds it STARTED. As for a settle the
		// ledger could not take, the receipt (with Actual) is the
		// caller's: a reopened store holds the work USAGE_UNKNOWN, and
		// Emergency.Settle with these ids and units resolves it.
		return nil, e.markLocalUnknown(receipt, serr)
	}
	return &EmergencyRunResult{RunResult: RunResult{Receipt: receipt, Refunded: settled.Refunded}, Local: settled}, werr
}

// markLocalUnknown marks started local work USAGE_UNKNOWN and returns the
// *UsageUnknownError with its receipt (Marked false, and the store's
// error joined to cause, when even that could not be recorded).
func (e *Emergency) markLocalUnknown(receipt OperationReceipt, cause error) error {
	_, err := e.store.MarkUsageUnknown(receipt.ReservationID)
	if err != nil {
		cause = errors.Join(cause, err)
	}
	return &UsageUnknownError{Receipt: receipt, Marked: err == nil, Err: cause}
}
