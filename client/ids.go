package client

import (
	"crypto/rand"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// Id prefixes. They keep reservation and operation ids apart in logs and
// keep ids of one kind sortable: the prefix is constant, so the byte order
// of the ids is the order of their ULIDs.
const (
	ReservationIDPrefix = "rl-"
	OperationIDPrefix   = "op-"
)

// idGenerator mints ULIDs whose order is the order of minting within this
// process: a monotonic entropy source under a mutex, and a timestamp that
// never moves backwards even if the wall clock is stepped back.
type idGenerator struct {
	mu      sync.Mutex
	lastMs  uint64
	entropy *ulid.MonotonicEntropy
	now     func() time.Time
}

func newIDGenerator(now func() time.Time) *idGenerator {
	// Entropy comes from crypto/rand: ids of different processes minted in
	// the same millisecond must not collide, and 80 random bits make that
	// negligible. Within one millisecond the monotonic source increments.
	return &idGenerator{entropy: ulid.Monotonic(rand.Reader, 0), now: now}
}

// next returns a new ULID strictly greater than every ULID this generator
// returned before.
func (g *idGenerator) next() ulid.ULID {
	g.mu.Lock()
	defer g.mu.Unlock()
	ms := ulid.Timestamp(g.now())
	if ms < g.lastMs {
		ms = g.lastMs
	}
	for {
		id, err := ulid.New(ms, g.entropy)
		if err == nil {
			g.lastMs = ms
			return id
		}
		// ErrMonotonicOverflow: the entropy of this millisecond is used up
		// (about 2^48 ids in one millisecond). Move to the next one, which
		// keeps the order; a crypto/rand failure is not recoverable here.
		if err != ulid.ErrMonotonicOverflow {
			panic("client: ulid entropy: " + err.Error())
		}
		ms++
	}
}

var defaultIDs = newIDGenerator(time.Now)

// NewReservationID returns a fresh reservation id, "rl-" followed by a
// 26-character ULID (e.g. "rl-01J2Z3..."). Ids from one process sort in the
// order they were minted; ids from different processes sort by millisecond
// and are unique with overwhelming probability. Safe for concurrent use.
//
// Mint one id per logical request and reuse it on every retry of that
// request: the id is what makes a retry recognisable to the ledger.
func NewReservationID() string { return ReservationIDPrefix + defaultIDs.next().String() }

// NewOperationID returns a fresh operation id ("op-" + ULID) to bind at
// Start. Safe for concurrent use.
func NewOperationID() string { return OperationIDPrefix + defaultIDs.next().String() }
