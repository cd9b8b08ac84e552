package codec

import (
	"fmt"
	"math"
	"time"

	"github.com/capledger/capledger/ledger"
)

// MinTime and MaxTime bound the non-zero times a store can keep: the range
// of int64 Unix nanoseconds (years 1677 to 2262).
var (
	MinTime = time.Unix(0, math.MinInt64).UTC()
	MaxTime = time.Unix(0, math.MaxInt64).UTC()
)

// Conv converts between ledger values and SQL scalar columns under the
// conventions every driver shares, and remembers the first value it could
// not convert. Flatten or scan a whole row, then check Err once.
type Conv struct {
	err error
}

// Err returns the first conversion error, or nil.
func (c *Conv) Err() error { return c.err }

func (c *Conv) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// Nanos returns t as Unix nanoseconds, 0 for the zero time. A non-zero time
// outside [MinTime, MaxTime], or one that falls exactly on the Unix epoch
// (it would read back as the zero time), records an error and returns 0.
func (c *Conv) Nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	if t.Before(MinTime) || t.After(MaxTime) {
		c.fail(fmt.Errorf("time %s is outside the storable range [%s, %s]", t, MinTime, MaxTime))
		return 0
	}
	n := t.UnixNano()
	if n == 0 {
		c.fail(fmt.Errorf("time %s is the Unix epoch, which stores as the zero time", t))
	}
	return n
}

// Time returns the time of Unix nanoseconds n in UTC, or the zero time for 0.
func (c *Conv) Time(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// Int returns u as an int64 column value; above math.MaxInt64 it records an
// error (a signed 64-bit column would reorder it) and returns 0.
func (c *Conv) Int(u uint64) int64 {
	if u > math.MaxInt64 {
		c.fail(fmt.Errorf("value %d exceeds the storable maximum %d", u, int64(math.MaxInt64)))
		return 0
	}
	return int64(u)
}

// Uint returns the column value n as a uint64; a negative n records an
// error and returns 0.
func (c *Conv) Uint(n int64) uint64 {
	if n < 0 {
		c.fail(fmt.Errorf("%w: negative stored counter %d", ErrCorrupt, n))
		return 0
	}
	return uint64(n)
}

// Dims returns a stored dimension count; outside [0, MaxDimensions] it
// records an error and returns 0.
func (c *Conv) Dims(n int64) int {
	if n < 0 || n > ledger.MaxDimensions {
		c.fail(fmt.Errorf("%w: dimension count %d outside [0, %d]", ErrCorrupt, n, ledger.MaxDimensions))
		return 0
	}
	return int(n)
}

// State returns a stored reservation state; an unknown value records an
// error and returns 0.
func (c *Conv) State(n int64) ledger.State {
	if n < 0 || n > int64(ledger.StateReservationUnknown) {
		c.fail(fmt.Errorf("%w: reservation state %d", ErrCorrupt, n))
		return 0
	}
	return ledger.State(n)
}

// Kind returns a stored command kind (any uint8: the journal keeps kinds a
// newer binary wrote); outside a byte it records an error and returns 0.
func (c *Conv) Kind(n int64) ledger.Kind {
	if n < 0 || n > math.MaxUint8 {
		c.fail(fmt.Errorf("%w: command kind %d", ErrCorrupt, n))
		return 0
	}
	return ledger.Kind(n)
}

// MoveKind returns a stored move kind; outside a byte it records an error
// and returns 0.
func (c *Conv) MoveKind(n int64) ledger.MoveKind {
	if n < 0 || n > math.MaxUint8 {
		c.fail(fmt.Errorf("%w: move kind %d", ErrCorrupt, n))
		return 0
	}
	return ledger.MoveKind(n)
}

// Bool returns the column value of b (0 or 1).
func (c *Conv) Bool(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Amounts returns the amounts decoded from src, recording a decoding error.
func (c *Conv) Amounts(src []byte) ledger.Amounts {
	a, err := DecodeAmounts(src)
	c.fail(err)
	return a
}

// Balances returns the balances decoded from src, recording a decoding
// error.
func (c *Conv) Balances(src []byte) ledger.Balances {
	b, err := DecodeBalances(src)
	c.fail(err)
	return b
}

// Dimensions returns the policy dimensions decoded from src, recording a
// decoding error.
func (c *Conv) Dimensions(src []byte) []ledger.Dimension {
	d, err := DecodeDimensions(src)
	c.fail(err)
	return d
}

// EncodeDimensions returns the encoded dimensions, recording an error.
func (c *Conv) EncodeDimensions(dims []ledger.Dimension) []byte {
	b, err := EncodeDimensions(dims)
	c.fail(err)
	return b
}

// ShardAmounts sets s's amount vectors from src, recording a decoding error.
func (c *Conv) ShardAmounts(src []byte, s *ledger.Shard) {
	c.fail(DecodeShardAmounts(src, s))
}

// Signature returns a copy of the stored signature, recording an error.
func (c *Conv) Signature(src []byte) []byte {
	s, err := DecodeSignature(src)
	c.fail(err)
	return s
}
