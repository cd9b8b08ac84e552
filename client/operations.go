package client

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/opstatus"
)

// The gateway side of the USAGE_UNKNOWN resolver (docs/CLIENTS.md, "The
// operation-status endpoint"): Run records each operation in an
// OperationStore before it starts the work and when the work ends, and
// OperationStatusHandler answers the ledger's resolver from that record,
// so the ledger can settle work whose settle never arrived, after a
// gateway restart too.

// The states of an OperationRecord. The last four are the endpoint's
// answers; Starting is the record of an operation bound to a reservation
// whose work was not called yet.
const (
	OperationStarting     = "starting"
	OperationRunning      = opstatus.StatusRunning
	OperationFinished     = opstatus.StatusFinished
	OperationNeverStarted = opstatus.StatusNeverStarted
	OperationUnknown      = opstatus.StatusUnknown
)

// OperationRecord is what a gateway knows of one operation.
type OperationRecord struct {
	OperationID   string `json:"operationId"`
	ReservationID string `json:"reservationId"`
	Status        string `json:"status"`
	// ActualUnits are a finished operation's units.
	ActualUnits Units     `json:"actualUnits,omitempty"`
	UpdatedAt   time.Time `json:"updatedAt"`
	// Boot names the process that wrote the record: a record left
	// starting or running by an earlier process is resolved when the
	// store opens (OpenOperationStore).
	Boot string `json:"boot"`
}

// final reports whether a status may never change again.
func final(status string) bool {
	return status == OperationFinished || status == OperationNeverStarted
}

// OperationStore is a gateway's durable record of its operations. Put
// returns only once the record is durable. Implementations must be safe
// for concurrent use.
type OperationStore interface {
	// Put writes rec. It returns ErrOperationFinal, and changes nothing,
	// when the stored record is final (finished or never started) and
	// rec says something else.
	Put(ctx context.Context, rec OperationRecord) error
	// Get returns the record of an operation, and false when there is none.
	Get(ctx context.Context, operationID string) (OperationRecord, bool, error)
}

// ErrOperationFinal is returned by OperationStore.Put for a change to a
// finished or never-started operation.
var ErrOperationFinal = errors.New("operation record is final")

// FileOperationStore keeps one small JSON file per operation in a
// directory, written atomically (temporary file, fsync, rename, fsync of
// the directory). One process uses a directory at a time.
type FileOperationStore struct {
	dir  string
	boot string
	mu   sync.Mutex // serialises read-modify-write of one file
}

// OpenOperationStore opens (creating it) the directory dir as an
// OperationStore for a new process. Records an earlier process left
// behind are resolved: starting becomes never started (that process never
// called the work, and no process will), running becomes unknown (the
// work died with it; what it used is unknown unless the gateway learns
// it elsewhere and calls Finish).
func OpenOperationStore(dir string) (*FileOperationStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("operation store: %w", err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("operation store: %w", err)
	}
	s := &FileOperationStore{dir: dir, boot: hex.EncodeToString(b[:])}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("operation store: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			_ = os.Remove(filepath.Join(dir, name)) // a write a crash interrupted
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		rec, err := s.read(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		next := ""
		switch rec.Status {
		case OperationStarting:
			next = OperationNeverStarted
		case OperationRunning:
			next = OperationUnknown
		}
		if next != "" {
			rec.Status, rec.Boot, rec.UpdatedAt = next, s.boot, time.Now()
			if err := s.write(rec); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

func (s *FileOperationStore) path(operationID string) string {
	sum := sha256.Sum256([]byte(operationID))
	return filepath.Join(s.dir, hex.EncodeToString(sum[:16])+".json")
}

func (s *FileOperationStore) read(path string) (OperationRecord, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return OperationRecord{}, err
	}
	var rec OperationRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return OperationRecord{}, fmt.Errorf("operation store: %s: %w", path, err)
	}
	return rec, nil
}

func (s *FileOperationStore) write(rec OperationRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("operation store: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("operation store: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("operation store: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("operation store: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path(rec.OperationID)); err != nil {
		return fmt.Errorf("operation store: %w", err)
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("operation store: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("operation store: %w", err)
	}
	return nil
}

// Put implements OperationStore.
func (s *FileOperationStore) Put(ctx context.Context, rec OperationRecord) error {
	if rec.OperationID == "" || rec.ReservationID == "" {
		return errors.New("operation store: record without operation or reservation id")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.read(s.path(rec.OperationID))
	switch {
	case err == nil && final(old.Status) && (old.Status != rec.Status || !sameUnits(old.ActualUnits, rec.ActualUnits)):
		return fmt.Errorf("%w: %s is %s", ErrOperationFinal, rec.OperationID, old.Status)
	case err == nil && old.ReservationID != rec.ReservationID:
		return fmt.Errorf("operation store: %s belongs to reservation %s, not %s", rec.OperationID, old.ReservationID, rec.ReservationID)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return err
	}
	rec.Boot = s.boot
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now()
	}
	return s.write(rec)
}

// Get implements OperationStore.
func (s *FileOperationStore) Get(ctx context.Context, operationID string) (OperationRecord, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(s.path(operationID))
	if errors.Is(err, os.ErrNotExist) {
		return OperationRecord{}, false, nil
	}
	if err != nil {
		return OperationRecord{}, false, err
	}
	return rec, true, nil
}

// Unknown returns the records whose usage is unknown (left running by an
// earlier process, or marked unknown by Run): the operations a gateway
// may still resolve from another source (the backend's billing) with
// Finish.
func (s *FileOperationStore) Unknown() ([]OperationRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []OperationRecord
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		rec, err := s.read(filepath.Join(s.dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if rec.Status == OperationUnknown {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Prune removes the final records (finished, never started) last written
// before before, and returns how many it removed; records that are
// starting, running or unknown are never removed, since the resolver may
// still ask for them. Without it the directory grows by one small file
// per operation for good: call it periodically with a horizon longer than
// the ledger's resolver could still ask about settled work, i.e. at least
// the longest unknownDeadline of the server's resolver config (an hour or
// a day is typical). A pruned operation the resolver asks about answers
// "unknown" (404), which keeps its capacity held, never refunds it.
func (s *FileOperationStore) Prune(before time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("operation store: %w", err)
	}
	removed := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(s.dir, e.Name())
		rec, err := s.read(path)
		if err != nil {
			return removed, err
		}
		if !final(rec.Status) || !rec.UpdatedAt.Before(before) {
			continue
		}
		if err := os.Remove(path); err != nil {
			return removed, fmt.Errorf("operation store: %w", err)
		}
		removed++
	}
	return removed, nil
}

// PruneResolved removes the unknown records (OperationUnknown: left
// running by an earlier process, or marked unknown by Run) whose
// reservation the ledger, asked through c, says has ended (SETTLED,
// SETTLED_WITH_DEBT, RELEASED, EXPIRED: an operator or the resolver
// settled it), since nothing will ask for them again; Prune never
// removes unknown records. It returns how many it removed, and the first
// lookup error (the records it could not look up are kept).
func (s *FileOperationStore) PruneResolved(ctx context.Context, c *Client) (int, error) {
	unknown, err := s.Unknown()
	if err != nil {
		return 0, err
	}
	removed := 0
	var first error
	for _, rec := range unknown {
		res, err := c.GetReservation(ctx, rec.ReservationID)
		if err != nil {
			if first == nil {
				first = fmt.Errorf("operation %s: %w", rec.OperationID, err)
			}
			continue
		}
		if !terminal(res.GetState()) {
			continue
		}
		s.mu.Lock()
		path := s.path(rec.OperationID)
		now, err := s.read(path)
		if err == nil && now.Status == OperationUnknown {
			err = os.Remove(path)
			if err == nil {
				removed++
			}
		}
		s.mu.Unlock()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("operation store: %w", err)
		}
	}
	return removed, first
}

func terminal(st ledgerv1.ReservationState) bool {
	switch st {
	case ledgerv1.ReservationState_RESERVATION_STATE_SETTLED, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT,
		ledgerv1.ReservationState_RESERVATION_STATE_RELEASED, ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED:
		return true
	}
	return false
}

// Finish records that an operation ended with actual units: a gateway
// that learned them after a restart lets the resolver settle with them.
func Finish(ctx context.Context, s OperationStore, reservationID, operationID string, actual Units) error {
	return s.Put(ctx, OperationRecord{OperationID: operationID, ReservationID: reservationID, Status: OperationFinished, ActualUnits: actual})
}

func sameUnits(a, b Units) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// WithOperationStore makes Run (and Middleware) record every operation in
// s, so OperationStatusHandler can answer the ledger's resolver. Run
// records an operation as starting before Start, running before it calls
// the work (and does not call it if that record cannot be written),
// finished with the actual units before Settle, and unknown when the
// usage is unknown or is one the ledger would refuse (a negative amount,
// a unit the reservation does not have).
func WithOperationStore(s OperationStore) Option {
	return func(c *config) { c.operations = s }
}

// recordOperation writes the receipt's operation in the client's
// OperationStore, if it has one. It returns the store's error.
func (c *Client) recordOperation(ctx context.Context, receipt OperationReceipt, status string, actual Units) error {
	if c.ops == nil {
		return nil
	}
	wctx, cancel := c.detached(ctx)
	defer cancel()
	return c.ops.Put(wctx, OperationRecord{
		OperationID: receipt.OperationID, ReservationID: receipt.ReservationID, Status: status, ActualUnits: actual,
	})
}

// OperationStatusHandler serves the operation-status endpoint of
// docs/CLIENTS.md from store: GET .../operations/{operationId}?reservationId=...
// signed with secret (the route's secret in the ledger's
// --resolver-config). Mount it at the base the ledger is configured with,
// e.g. mux.Handle("/operations/", h) for base "https://gw:8443". It
// answers 401 to a request that is not signed with secret (or is more
// than 5 minutes old), 404 when the store has no record for that
// reservation and operation, 503 when the store cannot be read, and a
// signed 200 otherwise: starting and running read as running, the rest
// as they are.
func OperationStatusHandler(store OperationStore, secret []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		escaped := r.URL.EscapedPath()
		i := strings.LastIndex(escaped, "/operations/")
		if i < 0 {
			http.NotFound(w, r)
			return
		}
		operationID, err := url.PathUnescape(escaped[i+len("/operations/"):])
		reservationID := r.URL.Query().Get("reservationId")
		if err != nil || operationID == "" || reservationID == "" {
			http.Error(w, "want /operations/{operationId}?reservationId={reservationId}", http.StatusBadRequest)
			return
		}
		if err := opstatus.VerifyRequest(secret, r, reservationID, operationID, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		rec, ok, err := store.Get(r.Context(), operationID)
		if err != nil {
			http.Error(w, "operation store unavailable", http.StatusServiceUnavailable)
			return
		}
		if !ok || rec.ReservationID != reservationID {
			http.Error(w, "no record of this operation", http.StatusNotFound)
			return
		}
		a := opstatus.Answer{OperationID: operationID, ReservationID: reservationID, Status: rec.Status}
		switch rec.Status {
		case OperationStarting, OperationRunning:
			a.Status = OperationRunning
		case OperationFinished:
			a.ActualUnits = rec.ActualUnits
			if a.ActualUnits == nil {
				a.ActualUnits = map[string]int64{}
			}
		case OperationNeverStarted, OperationUnknown:
		default:
			a.Status = OperationUnknown
		}
		opstatus.WriteAnswer(w, r, secret, a)
	})
}
