// Package opstatus is the wire form of the operation-status endpoint
// (docs/CLIENTS.md, "The operation-status endpoint"): the gateway serves
// it (client.OperationStatusHandler), the ledger's resolver asks it
// (Client). Both sign with one shared secret per route, HMAC-SHA256 over
// the request and over the answer, so an answer that settles capacity is
// known to come from the gateway and to answer this very request.
package opstatus

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The answers' status values.
const (
	StatusFinished     = "finished"
	StatusRunning      = "running"
	StatusNeverStarted = "never_started"
	StatusUnknown      = "unknown"
)

// The headers and the signature scheme.
const (
	HeaderTimestamp = "Capledger-Timestamp"
	HeaderSignature = "Capledger-Signature"
	signaturePrefix = "v1="
	scheme          = "capledger-operation-status.v1"
	// MaxSkew is how far a request's timestamp may be from the gateway's
	// clock.
	MaxSkew = 5 * time.Minute
	// maxBody bounds an answer the client reads.
	maxBody = 64 << 10
)

// Answer is the JSON body of a 200 answer.
type Answer struct {
	OperationID   string           `json:"operationId"`
	ReservationID string           `json:"reservationId"`
	Status        string           `json:"status"`
	ActualUnits   map[string]int64 `json:"actualUnits,omitempty"`
}

// Path returns the request path and query under base for one operation.
func Path(reservationID, operationID string) string {
	return "/operations/" + url.PathEscape(operationID) + "?reservationId=" + url.QueryEscape(reservationID)
}

func mac(secret []byte, parts ...string) string {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(strings.Join(parts, "\n")))
	return signaturePrefix + hex.EncodeToString(h.Sum(nil))
}

// SignRequest returns the Capledger-Signature of a request sent at the
// Unix second timestamp.
func SignRequest(secret []byte, timestamp, reservationID, operationID string) string {
	return mac(secret, scheme+" request", timestamp, reservationID, operationID)
}

// SignAnswer returns the Capledger-Signature of an answer body to the
// request with that timestamp.
func SignAnswer(secret []byte, timestamp, reservationID, operationID string, body []byte) string {
	return mac(secret, scheme+" response", timestamp, reservationID, operationID, string(body))
}

// VerifyRequest returns nil when r carries a valid signature for the ids,
// with a timestamp within MaxSkew of now, and an error saying what is wrong
// otherwise.
func VerifyRequest(secret []byte, r *http.Request, reservationID, operationID string, now time.Time) error {
	ts := r.Header.Get(HeaderTimestamp)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%s %q is not Unix seconds", HeaderTimestamp, ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > MaxSkew || d < -MaxSkew {
		return fmt.Errorf("%s is %v away from this clock (at most %v)", HeaderTimestamp, d.Round(time.Second), MaxSkew)
	}
	want := SignRequest(secret, ts, reservationID, operationID)
	if !hmac.Equal([]byte(want), []byte(r.Header.Get(HeaderSignature))) {
		return errors.New("wrong " + HeaderSignature)
	}
	return nil
}

// Result is what Client.Get learned: a verified, well-formed answer.
type Result struct {
	// Status is StatusFinished, StatusRunning, StatusNeverStarted or
	// StatusUnknown (a 404 reads as StatusUnknown).
	Status string
	// Units are the actual units of a finished operation.
	Units map[string]int64
	// Signed is true when the answer's signature verified; Get returns
	// an error instead of an unsigned finished or never-started answer.
	Signed bool
}

// Client asks one gateway's operation-status endpoint.
type Client struct {
	// Base is the endpoint's base URL ("https://gw.internal:8443").
	Base   string
	Secret []byte
	// HTTP is the client used (its Timeout bounds a call); nil for one
	// with a 5 s timeout.
	HTTP *http.Client
	// Now reads the clock for the request timestamp; nil for time.Now.
	Now func() time.Time
}

// ErrUnsigned is wrapped by Get for an answer that would settle capacity
// (finished, never started) but whose signature does not verify.
var ErrUnsigned = errors.New("operation status answer is not signed with the route's secret")

// ErrBadAnswer is wrapped by Get for an answer the endpoint gave that
// cannot be used: a status code below 500 other than 200, 404, 408 and
// 429, a body over the limit or not an Answer for these ids, an unknown
// status, a negative unit, an unsigned settling answer (ErrUnsigned too).
// Errors without it (a transport error, a timeout, a 5xx, a 408 or 429, a
// body cut off) mean the endpoint could not answer.
var ErrBadAnswer = errors.New("operation status answer unusable")

// badAnswer wraps err with ErrBadAnswer, keeping err's message.
type badAnswer struct{ err error }

func (e badAnswer) Error() string   { return e.err.Error() }
func (e badAnswer) Unwrap() []error { return []error{e.err, ErrBadAnswer} }

func bad(format string, args ...any) error { return badAnswer{fmt.Errorf(format, args...)} }

var defaultHTTP = &http.Client{Timeout: 5 * time.Second}

// Get asks for one operation's status. It returns the Result of a
// well-formed answer (running and unknown need no signature; a 404 is
// unknown), or an error for everything else: a transport error or
// timeout, a status code other than 200 and 404, a body that is not an
// Answer for these ids, an unknown status, a negative unit, or a finished
// or never-started answer that is not signed (ErrUnsigned). Errors about
// an answer the endpoint gave wrap ErrBadAnswer. The caller must leave the
// reservation as it is on an error.
func (c *Client) Get(ctx context.Context, reservationID, operationID string) (Result, error) {
	if reservationID == "" || operationID == "" {
		return Result{}, errors.New("operation status: empty reservation or operation id")
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.Base, "/")+Path(reservationID, operationID), nil)
	if err != nil {
		return Result{}, fmt.Errorf("operation status: %w", err)
	}
	ts := strconv.FormatInt(now().Unix(), 10)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, SignRequest(c.Secret, ts, reservationID, operationID))
	resp, err := hc.Do(req)
	if err != nil {
		return Result{}, fmt.Errorf("operation status %s: %w", operationID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return Result{}, fmt.Errorf("operation status %s: read: %w", operationID, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return Result{Status: StatusUnknown}, nil
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		// The endpoint could not answer now (a 429 or 408 is shedding
		// load, as a 5xx): not this reservation's answer, so not
		// ErrBadAnswer, and no comeback burst is aimed at an endpoint that
		// asked for less.
		return Result{}, fmt.Errorf("operation status %s: HTTP %d", operationID, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return Result{}, bad("operation status %s: HTTP %d", operationID, resp.StatusCode)
	case len(body) > maxBody:
		return Result{}, bad("operation status %s: answer over %d bytes", operationID, maxBody)
	}
	var a Answer
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return Result{}, bad("operation status %s: answer is not JSON of the contract: %w", operationID, err)
	}
	if a.OperationID != operationID || a.ReservationID != reservationID {
		return Result{}, bad("operation status %s: answer is for operation %q of reservation %q", operationID, a.OperationID, a.ReservationID)
	}
	signed := hmac.Equal([]byte(SignAnswer(c.Secret, ts, reservationID, operationID, body)), []byte(resp.Header.Get(HeaderSignature)))
	res := Result{Status: a.Status, Signed: signed}
	switch a.Status {
	case StatusRunning, StatusUnknown:
		return res, nil
	case StatusNeverStarted:
		if len(a.ActualUnits) > 0 {
			return Result{}, bad("operation status %s: never started with actual units", operationID)
		}
	case StatusFinished:
		for unit, n := range a.ActualUnits {
			if n < 0 || unit == "" {
				return Result{}, bad("operation status %s: unit %q = %d", operationID, unit, n)
			}
		}
		res.Units = a.ActualUnits
	default:
		return Result{}, bad("operation status %s: unknown status %q", operationID, a.Status)
	}
	if !signed {
		return Result{}, bad("operation status %s: %s answer: %w", operationID, a.Status, ErrUnsigned)
	}
	return res, nil
}

// WriteAnswer writes a signed 200 answer to the request r (whose
// timestamp the signature binds).
func WriteAnswer(w http.ResponseWriter, r *http.Request, secret []byte, a Answer) {
	body, err := json.Marshal(a)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(HeaderSignature, SignAnswer(secret, r.Header.Get(HeaderTimestamp), a.ReservationID, a.OperationID, body))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
