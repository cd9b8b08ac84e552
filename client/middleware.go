package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/capledger/capledger/api/digest"
	"github.com/capledger/capledger/ledger"
)

// Estimator estimates the units of an incoming request before it runs.
type Estimator interface {
	// Estimate returns the estimated units of r, whose body (already read,
	// and restored on r for the handler) is body; an error answers 400.
	Estimate(r *http.Request, body []byte) (Units, error)
	// Digest identifies the estimator's version; it goes into every request
	// digest so receipts can be traced to the estimator that sized them.
	Digest() string
}

type estimatorFunc struct {
	digest string
	f      func(r *http.Request, body []byte) (Units, error)
}

func (e estimatorFunc) Estimate(r *http.Request, body []byte) (Units, error) { return e.f(r, body) }
func (e estimatorFunc) Digest() string                                       { return e.digest }

// NewEstimator returns an Estimator from a function and the digest of its
// version (e.g. "sha256:<hash of the tokenizer and the formula>" or a
// version string).
func NewEstimator(digest string, f func(r *http.Request, body []byte) (Units, error)) Estimator {
	return estimatorFunc{digest: digest, f: f}
}

// UsageInfo is what a UsageReader sees of a finished request.
type UsageInfo struct {
	Request *http.Request
	// Status is the status code the handler wrote (200 if it wrote a body
	// without one, 0 if it wrote nothing).
	Status int
	// Header is the response header as the handler left it.
	Header http.Header
	// Reported is what the handler passed to ReportUsage, nil if nothing.
	Reported Units
	// Estimate is what was reserved.
	Estimate Units
	// Stream scanned the body of a text/event-stream answer as it was
	// written (nil for other answers): UsageFromStream reads its last
	// usage event.
	Stream *SSEUsageScanner
}

// UsageReader returns the actual units of a finished request; a unit of the
// estimate it leaves out is settled at its estimate. Returning an
// error wrapping ErrUsageUnknown marks the reservation USAGE_UNKNOWN (its
// capacity stays held until ResolveUnknown); any other error is logged and
// the request is settled at its full estimate.
type UsageReader func(u *UsageInfo) (Units, error)

// UsageFromHeaders returns a UsageReader that takes the usage the handler
// reported with ReportUsage if any, else parses the response headers named
// by headerByUnit (unit -> header, e.g. {"tokens": "X-Usage-Tokens"}). A
// missing or malformed header gives ErrUsageUnknown.
func UsageFromHeaders(headerByUnit map[string]string) UsageReader {
	return func(u *UsageInfo) (Units, error) {
		if u.Reported != nil {
			return u.Reported, nil
		}
		actual := make(Units, len(headerByUnit))
		for unit, header := range headerByUnit {
			v := u.Header.Get(header)
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("usage header %s = %q: %w", header, v, ErrUsageUnknown)
			}
			actual[unit] = n
		}
		return actual, nil
	}
}

type usageSlotKey struct{}

type usageSlot struct{ units Units }

// ReportUsage records the actual units of the request whose context is
// ctx (the handler's r.Context() under Middleware), for the middleware to
// settle (later calls replace earlier ones). It may be called at any time
// until the handler returns, also after the response was written or while
// it streams. It returns false when ctx is not a request running under
// Middleware.
func ReportUsage(ctx context.Context, actual Units) bool {
	slot, ok := ctx.Value(usageSlotKey{}).(*usageSlot)
	if !ok {
		return false
	}
	slot.units = actual
	return true
}

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Route and Region name the policy key of every request (Region empty:
	// "global").
	Route  string
	Region string
	// Subject returns the tenant of a request (e.g. from its API key); an
	// error answers 401.
	Subject func(r *http.Request) (string, error)
	// Estimator sizes the reservation (required).
	Estimator Estimator
	// Usage reads the actual units after the handler; nil: what the handler
	// passed to ReportUsage, else the full estimate, or USAGE_UNKNOWN when
	// the client went away before the handler returned.
	Usage UsageReader
	// MaxBodyBytes bounds the request body read for estimation and hashing
	// (default 1 MiB); larger bodies answer 413.
	MaxBodyBytes int64
	// Queue, if set, holds reserved requests and dispatches them to the
	// handler fairly among tenants, at most its Concurrency at once.
	Queue *FairQueue
	// Emergency, if set, runs the middleware in partition mode: requests
	// are reserved through Emergency.Reserve, so that while the ledger is
	// unreachable (its Client's breaker open) they are admitted from the
	// gateway's shards instead of answering 503, and started and settled
	// wherever they were admitted. It must wrap the same Client.
	Emergency *Emergency
	// Logger receives settlement problems (default slog.Default()).
	Logger *slog.Logger
}

// ReservationHeader carries the reservation id of a request on its response.
const ReservationHeader = "X-Capledger-Reservation"

// RejectionBody is the JSON body of a 429 the middleware answers.
type RejectionBody struct {
	Error string `json:"error"`
	// Reason: INSUFFICIENT_CAPACITY, ADMISSION_FROZEN,
	// RESERVATION_TOO_LARGE, QUEUE_FULL (the fair queue is full), or
	// PROXY_REFUSED (a proxy between the gateway and the ledger answered
	// 429: no limiting dimension or generation).
	Reason            string `json:"reason"`
	LimitingDimension string `json:"limiting_dimension"`
	PolicyGeneration  uint64 `json:"policy_generation,omitempty"`
	// RetryAfterSeconds is absent when no wait helps.
	RetryAfterSeconds int64 `json:"retry_after_seconds,omitempty"`
}

// Middleware returns net/http middleware that puts every request under a
// reservation: it estimates the request's units, reserves them (a refusal
// answers 429 with Retry-After and a RejectionBody), optionally waits for a
// fair-queue slot, starts the reservation, runs the handler, and settles
// the usage cfg.Usage reads. Like Run, it never refunds a started request
// because its client went away: the usage is settled, or the reservation
// is marked USAGE_UNKNOWN (its receipt in PendingUnknown; for a request
// served from a shard, in the shard store, logged with its operation id
// for Emergency.Settle).
//
// Other answers: 401 when Subject fails, 413 for a body over MaxBodyBytes,
// 400 when the estimator fails, 403 (reason NO_POLICY) when no policy
// covers the subject, 500 {"error": "capledger refused: REASON", "reason":
// "REASON"} without Retry-After when the ledger (or the SDK before
// sending) refused the request for a reason no retry changes, a
// configuration error of the gateway: UNKNOWN_UNIT (the estimator names a
// unit the policy lacks), INVALID_COMMAND, DIGEST_MISMATCH,
// ACCOUNT_LIFETIME_EXHAUSTED, PERMISSION_DENIED or UNAUTHENTICATED (the
// gateway's token), or the connect code of an answer without a reason;
// the full error is logged at level Error.
// 503 with Retry-After: 1 when the ledger cannot be reached or its answer
// stayed unknown (the request does not run: the middleware fails closed;
// once the Client's breaker is open that answer is immediate). With
// cfg.Emergency set, an unreachable ledger instead admits from the
// gateway's shard (partition mode), and 503 means no shard admits either.
// With cfg.Queue: 429 QUEUE_FULL (Retry-After: 1) for a tenant whose
// queue is full, 429 RESERVATION_TOO_LARGE (no Retry-After) for a
// reservation above the queue's largest cost (ErrCostTooLarge); the
// reservation is released. A refusal after the reservation was made
// names it in ReservationHeader too. Any other refusal before the handler runs
// (e.g. Start refused because the hold expired while the request waited
// in the queue) is 503 with Retry-After: 1 too, and the request does not
// run.
//
// The handler runs with the reservation in its request's context:
// ReceiptFrom(r.Context()) returns its OperationReceipt (reservation id,
// operation id, subject, estimate), and the response carries the id in
// ReservationHeader. Usage, by cfg.Usage: ReportUsage(r.Context(), units)
// at any time before the handler returns, including after the headers
// and body were written (a streamed answer reports at its end); response
// headers (UsageFromHeaders); or a text/event-stream answer's final usage
// event (UsageFromStream, OpenAI style). To abort a response (cut the
// connection so the client sees no complete answer), the handler panics
// with http.ErrAbortHandler: after ReportUsage the request is settled with
// the reported usage, without it it is USAGE_UNKNOWN (never refunded);
// the panic then reaches net/http, which aborts the connection silently.
// It returns an error for a config without Route, Subject or Estimator.
func (c *Client) Middleware(cfg MiddlewareConfig) (func(http.Handler) http.Handler, error) {
	if cfg.Route == "" || cfg.Subject == nil || cfg.Estimator == nil {
		return nil, errors.New("middleware: Route, Subject and Estimator are required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return func(next http.Handler) http.Handler {
		return &middleware{c: c, cfg: cfg, next: next}
	}, nil
}

type middleware struct {
	c    *Client
	cfg  MiddlewareConfig
	next http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	subject, err := m.cfg.Subject(r)
	if err != nil || subject == "" {
		writeJSONError(w, http.StatusUnauthorized, "unknown subject", err)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBodyBytes+1))
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "cannot read body", err)
		return
	}
	if int64(len(body)) > m.cfg.MaxBodyBytes {
		writeJSONError(w, http.StatusRequestEntityTooLarge, "body too large", fmt.Errorf("limit is %d bytes", m.cfg.MaxBodyBytes))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	estimate, err := m.cfg.Estimator.Estimate(r, body)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "cannot estimate request", err)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	req := ReserveRequest{
		Subject: subject, Route: m.cfg.Route, Region: m.cfg.Region, Units: estimate,
		EstimatorDigest: m.cfg.Estimator.Digest(), BodyHash: BodyHash(body),
	}

	// reserved is the id of the request's reservation once the ledger (or
	// a shard) made it: a refusal after that (QUEUE_FULL, a Start refused)
	// names the reservation it released in ReservationHeader too.
	var reserved string
	g := func(ctx context.Context, rr *ReserveResult) (func(Units), error) {
		reserved = rr.ReservationID
		if m.cfg.Queue == nil {
			return func(Units) {}, nil
		}
		return m.cfg.Queue.acquire(ctx, rr)
	}
	ran, aborted := false, false
	rec := &recorder{ResponseWriter: w}
	work := func(ctx context.Context) (actual Units, err error) {
		ran = true
		slot := &usageSlot{}
		if receipt, ok := ReceiptFrom(ctx); ok {
			w.Header().Set(ReservationHeader, receipt.ReservationID)
		}
		defer func() {
			// panic(http.ErrAbortHandler) is how a handler aborts its
			// response. With usage reported first it is settled; without,
			// the panic goes on and the work is USAGE_UNKNOWN.
			if p := recover(); p != nil {
				if p != http.ErrAbortHandler || slot.units == nil {
					panic(p)
				}
				aborted, actual, err = true, slot.units, nil
			}
		}()
		m.next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, usageSlotKey{}, slot)))
		info := &UsageInfo{Request: r, Status: rec.status, Header: rec.Header(), Reported: slot.units, Estimate: estimate, Stream: rec.stream}
		if m.cfg.Usage == nil {
			if info.Reported != nil {
				return statedForEvery(info.Reported, estimate), nil
			}
			if cerr := r.Context().Err(); cerr != nil {
				// The client went away and the handler reported
				// nothing: the backend it called may still be at work,
				// so the estimate is no measure of its usage.
				return nil, fmt.Errorf("client went away before the handler reported usage (%w): %w", cerr, ErrUsageUnknown)
			}
			return estimate, nil
		}
		actual, uerr := m.cfg.Usage(info)
		if uerr != nil && !errors.Is(uerr, ErrUsageUnknown) {
			m.cfg.Logger.Warn("capledger: usage reader failed; settling the estimate", "subject", subject, "err", uerr)
			return estimate, nil
		}
		if uerr == nil {
			actual = statedForEvery(actual, estimate)
		}
		return actual, uerr
	}
	if m.cfg.Emergency != nil {
		_, err = m.cfg.Emergency.run(r.Context(), req, work, g)
	} else {
		_, err = m.c.run(r.Context(), req, work, g)
	}
	if aborted {
		defer panic(http.ErrAbortHandler) // after the bookkeeping below
	}
	if err == nil {
		return
	}
	if ran {
		// The handler answered; what is left is bookkeeping.
		var unknown *UsageUnknownError
		if errors.As(err, &unknown) && m.cfg.Emergency != nil && m.cfg.Emergency.store.Has(unknown.Receipt.ReservationID) {
			// Served from a shard: the shard store keeps the receipt
			// (not PendingUnknown), and only a local settle resolves it.
			m.cfg.Logger.Warn("capledger: usage unknown; left USAGE_UNKNOWN in its emergency shard: settle it with Emergency.Settle and this operation id",
				"reservation", unknown.Receipt.ReservationID, "operation", unknown.Receipt.OperationID,
				"actual", unknown.Receipt.Actual, "marked", unknown.Marked, "err", unknown.Err)
			return
		}
		if unknown != nil && unknown.Receipt.Actual != nil {
			m.cfg.Logger.Warn("capledger: settle not confirmed; receipt kept (PendingUnknown) and resent with the same ids",
				"reservation", unknown.Receipt.ReservationID, "operation", unknown.Receipt.OperationID, "err", unknown.Err)
			return
		}
		if unknown != nil {
			m.cfg.Logger.Warn("capledger: usage unknown; receipt kept for ResolveUnknown",
				"reservation", unknown.Receipt.ReservationID, "operation", unknown.Receipt.OperationID, "err", unknown.Err)
			return
		}
		m.cfg.Logger.Error("capledger: settle", "subject", subject, "err", err)
		return
	}
	if reserved != "" {
		w.Header().Set(ReservationHeader, reserved)
	}
	m.refuse(w, r, err)
}

// refuse answers a request that did not run.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	var rej *RejectedError
	switch {
	case errors.As(err, &rej):
		body := RejectionBody{Error: "rate_limited", Reason: rej.Reason, LimitingDimension: rej.Dimension,
			PolicyGeneration: rej.Generation, RetryAfterSeconds: rej.RetryAfterSeconds()}
		if body.RetryAfterSeconds > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(body.RetryAfterSeconds, 10))
		}
		writeJSON(w, http.StatusTooManyRequests, body)
	case errors.Is(err, ErrCostTooLarge):
		// The fair queue cannot charge it: no wait helps.
		writeJSON(w, http.StatusTooManyRequests, RejectionBody{Error: "rate_limited", Reason: "RESERVATION_TOO_LARGE", LimitingDimension: m.cfg.Queue.costUnit})
	case errors.Is(err, ErrQueueFull):
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, RejectionBody{Error: "rate_limited", Reason: "QUEUE_FULL", LimitingDimension: "queue", RetryAfterSeconds: 1})
	case errors.Is(err, ErrNoPolicy):
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "no capacity policy covers this subject and route", "reason": ReasonNoPolicy})
	case r.Context().Err() != nil:
		// The client went away before the request started; nobody reads
		// the answer, and the reservation was released.
		w.WriteHeader(499)
	case configurationRefusal(err) != "":
		// No retry changes this answer: it is the gateway's configuration
		// (its estimator, Subject, token), not an outage, so it must not
		// read as one (503) nor invite retries.
		reason := configurationRefusal(err)
		m.cfg.Logger.Error("capledger: request refused by the ledger; check the gateway's configuration", "reason", reason, "err", err)
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "capledger refused: " + reason, "reason": reason})
	default:
		m.cfg.Logger.Warn("capledger: request not admitted", "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, "capacity ledger unavailable", nil)
	}
}

// configurationRefusal returns the reason of a refusal before the handler
// that no retry of the request can change: an answer the ledger decided
// (*LedgerError: UNKNOWN_UNIT, INVALID_COMMAND, DIGEST_MISMATCH,
// ACCOUNT_LIFETIME_EXHAUSTED, a token without the role or scope; its
// connect code when it carries no reason), or INVALID_COMMAND for a
// request the SDK refuses before sending it (a negative estimate, a
// command a shard refuses as the ledger would). It returns "" for every
// other error: unreachable ledger, lost answers, and Start refused
// because the hold expired or was released while the request waited
// (RESERVATION_EXPIRED, RESERVATION_RELEASED), which a new attempt can
// pass.
func configurationRefusal(err error) string {
	var le *LedgerError
	if errors.As(err, &le) {
		switch {
		case le.Reason == ReasonReservationExpired || le.Reason == ReasonReservationReleased:
			return ""
		case le.Reason != "":
			return le.Reason
		}
		return strings.ToUpper(le.Code.String())
	}
	if errors.Is(err, digest.ErrInvalidInput) || errors.Is(err, ledger.ErrInvalidCommand) {
		return "INVALID_COMMAND"
	}
	return ""
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, msg string, err error) {
	body := map[string]string{"error": msg}
	if err != nil {
		body["detail"] = err.Error()
	}
	writeJSON(w, status, body)
}

// recorder notes the status the handler writes; it passes everything
// through, including Flush for streamed answers.
type recorder struct {
	http.ResponseWriter
	status int
	// stream scans a text/event-stream body for its usage event.
	stream *SSEUsageScanner
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
		if strings.HasPrefix(r.Header().Get("Content-Type"), "text/event-stream") {
			r.stream = NewSSEUsageScanner()
		}
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	n, err := r.ResponseWriter.Write(b)
	if r.stream != nil {
		r.stream.Write(b[:n])
	}
	return n, err
}

func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	http.NewResponseController(r.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// statedForEvery returns actual with every unit of the estimate that
// actual does not name settled at its estimate. The ledger refuses a settle
// that leaves out a reserved unit (a missing unit must never read as "used
// nothing"), and a usage reader that measures only some units (say tokens
// from a header, but not the request itself) has not measured the others:
// the estimate is the conservative figure for them.
func statedForEvery(actual, estimate Units) Units {
	var out Units
	for unit, n := range estimate {
		if _, ok := actual[unit]; ok {
			continue
		}
		if out == nil { // a copy: the map may be the handler's own
			out = make(Units, len(actual)+len(estimate))
			for u, v := range actual {
				out[u] = v
			}
		}
		out[unit] = n
	}
	if out == nil {
		return actual
	}
	return out
}
