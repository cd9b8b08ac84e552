// Package codec encodes the ledger's composite fields for the SQL drivers
// (SQLite, PostgreSQL), so both store the same bytes and read back the same
// values.
//
// Hot rows (accounts, reservations, journal entries) are written on every
// command, so their vectors use a compact binary form instead of JSON: one
// format tag byte (which also carries the format version), a count of the
// dimensions in use, then zig-zag varints (encoding/binary). Trailing zero
// dimensions are not written, so a one-dimension account stores 1 + 1 + 9
// varints. Policies are written once per generation and use JSON.
//
// Scalar columns follow one convention in every driver: times are Unix
// nanoseconds in an int64 (0 for the zero time.Time) and read back in UTC;
// uint64 counters (generations, fences, versions) are stored as int64 and
// must not exceed math.MaxInt64. Conv applies both rules and collects the
// first violation, so a driver flattens a row and checks one error.
//
// Every decoder returns an error, never panics, on bytes it did not write.
package codec

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/capledger/capledger/ledger"
)

// Format tags: the first byte of every binary value. The high nibble names
// the kind of value, the low nibble its format version, so a value read from
// the wrong column or written by a newer binary is an error, not garbage.
const (
	TagAmountsV1      byte = 0xA1
	TagBalancesV1     byte = 0xB1
	TagShardAmountsV1 byte = 0xC1
)

// balanceTerms is how many terms one ledger.Balance holds.
const balanceTerms = 9

// ErrCorrupt is wrapped by every decoding error: the bytes are not a value
// this package wrote.
var ErrCorrupt = errors.New("corrupt encoded value")

func corrupt(what, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrCorrupt, what, fmt.Sprintf(format, args...))
}

// usedAmounts returns how many leading dimensions hold the non-zero values.
func usedAmounts(a *ledger.Amounts) int {
	n := len(a)
	for n > 0 && a[n-1] == 0 {
		n--
	}
	return n
}

func usedBalances(b *ledger.Balances) int {
	n := len(b)
	for n > 0 && b[n-1] == (ledger.Balance{}) {
		n--
	}
	return n
}

func appendAmountsBody(dst []byte, a *ledger.Amounts) []byte {
	n := usedAmounts(a)
	dst = append(dst, byte(n))
	for i := 0; i < n; i++ {
		dst = binary.AppendVarint(dst, a[i])
	}
	return dst
}

// AppendAmounts appends the encoding of a (Amounts, Reserved/Actual/Overdraft,
// move units, or a RefilledTo cursor: all are [MaxDimensions]int64) to dst
// and returns the extended slice.
func AppendAmounts(dst []byte, a *ledger.Amounts) []byte {
	dst = append(dst, TagAmountsV1)
	return appendAmountsBody(dst, a)
}

// EncodeAmounts returns the encoding of a in a new slice.
func EncodeAmounts(a *ledger.Amounts) []byte {
	return AppendAmounts(make([]byte, 0, 2+MaxVarintLen*usedAmounts(a)), a)
}

// MaxVarintLen is the longest encoding of one int64.
const MaxVarintLen = binary.MaxVarintLen64

// DecodeAmounts returns the amounts encoded in src, or an error wrapping
// ErrCorrupt when src is not exactly one encoded Amounts.
func DecodeAmounts(src []byte) (ledger.Amounts, error) {
	var out ledger.Amounts
	r := NewReader("amounts", src)
	r.Tag(TagAmountsV1)
	r.amountsBody(&out)
	r.End()
	return out, r.err
}

// CutAmounts decodes the Amounts encoded at the start of src and returns
// them and the bytes after them, or an error wrapping ErrCorrupt where
// Reader.Amounts would fail. It is Reader.Amounts without a Reader, for a
// full audit, which reads three per reservation.
func CutAmounts(src []byte) (a ledger.Amounts, rest []byte, err error) {
	if len(src) < 2 || src[0] != TagAmountsV1 {
		r := NewReader("amounts", src)
		r.Tag(TagAmountsV1)
		r.count()
		return a, nil, r.err
	}
	n := int(src[1])
	if n > ledger.MaxDimensions {
		return a, nil, corrupt("amounts", "%d dimensions, at most %d", n, ledger.MaxDimensions)
	}
	rest = src[2:]
	for i := range n {
		v, k := binary.Varint(rest)
		if k <= 0 {
			return ledger.Amounts{}, nil, corrupt("amounts", "truncated or overlong varint")
		}
		a[i], rest = v, rest[k:]
	}
	return a, rest, nil
}

// AppendBalances appends the encoding of b (the used dimensions, nine terms
// each) to dst and returns the extended slice.
func AppendBalances(dst []byte, b *ledger.Balances) []byte {
	n := usedBalances(b)
	dst = append(dst, TagBalancesV1, byte(n))
	for i := 0; i < n; i++ {
		t := &b[i]
		dst = binary.AppendVarint(dst, t.Opening)
		dst = binary.AppendVarint(dst, t.Minted)
		dst = binary.AppendVarint(dst, t.OverdraftIssued)
		dst = binary.AppendVarint(dst, t.Available)
		dst = binary.AppendVarint(dst, t.Reserved)
		dst = binary.AppendVarint(dst, t.Spent)
		dst = binary.AppendVarint(dst, t.RetiredForEmergency)
		dst = binary.AppendVarint(dst, t.RetiredForMove)
		dst = binary.AppendVarint(dst, t.OverdraftRepaid)
	}
	return dst
}

// EncodeBalances returns the encoding of b in a new slice.
func EncodeBalances(b *ledger.Balances) []byte {
	return AppendBalances(make([]byte, 0, 2+balanceTerms*MaxVarintLen*usedBalances(b)), b)
}

// DecodeBalances returns the balances encoded in src, or an error wrapping
// ErrCorrupt when src is not exactly one encoded Balances.
func DecodeBalances(src []byte) (ledger.Balances, error) {
	var out ledger.Balances
	r := NewReader("balances", src)
	r.Tag(TagBalancesV1)
	n := r.count()
	for i := 0; i < n && r.err == nil; i++ {
		t := &out[i]
		for _, term := range [balanceTerms]*int64{&t.Opening, &t.Minted, &t.OverdraftIssued, &t.Available,
			&t.Reserved, &t.Spent, &t.RetiredForEmergency, &t.RetiredForMove, &t.OverdraftRepaid} {
			*term = r.Varint()
		}
	}
	r.End()
	return out, r.err
}

// EncodeShardAmounts returns the encoding of a shard's four amount vectors
// (Allocated, Spent, Unknown, Reminted) in one value.
func EncodeShardAmounts(s *ledger.Shard) []byte {
	dst := make([]byte, 0, 1+4*(1+MaxVarintLen*ledger.MaxDimensions))
	dst = append(dst, TagShardAmountsV1)
	for _, a := range [...]*ledger.Amounts{&s.Allocated, &s.Spent, &s.Unknown, &s.Reminted} {
		dst = appendAmountsBody(dst, a)
	}
	return dst
}

// DecodeShardAmounts sets s's Allocated, Spent, Unknown and Reminted from
// src and returns nil, or returns an error wrapping ErrCorrupt and leaves s
// unchanged.
func DecodeShardAmounts(src []byte, s *ledger.Shard) error {
	var vectors [4]ledger.Amounts
	r := NewReader("shard amounts", src)
	r.Tag(TagShardAmountsV1)
	for i := range vectors {
		r.amountsBody(&vectors[i])
	}
	r.End()
	if r.err != nil {
		return r.err
	}
	s.Allocated, s.Spent, s.Unknown, s.Reminted = vectors[0], vectors[1], vectors[2], vectors[3]
	return nil
}

// MaxSignatureLen bounds a stored shard signature (Ed25519 signatures are 64
// bytes; the bound leaves room for other schemes and rejects garbage).
const MaxSignatureLen = 1024

// EncodeSignature returns the column value of a shard signature: the bytes
// themselves, with nil stored as an empty, non-NULL value.
func EncodeSignature(sig []byte) []byte {
	if sig == nil {
		return []byte{}
	}
	return sig
}

// DecodeSignature returns a copy of the stored signature (nil when empty, so
// a shard written without one reads back without one), or an error wrapping
// ErrCorrupt when it is longer than MaxSignatureLen.
func DecodeSignature(src []byte) ([]byte, error) {
	if len(src) > MaxSignatureLen {
		return nil, corrupt("signature", "%d bytes, at most %d", len(src), MaxSignatureLen)
	}
	if len(src) == 0 {
		return nil, nil
	}
	return append([]byte(nil), src...), nil
}

// Reader decodes one value of the stores' binary formats, keeping the
// first error so a decoder reads straight through; once Err is set every
// method returns zero. The errors wrap ErrCorrupt and name what is read.
type Reader struct {
	what string
	buf  []byte
	err  error
}

// NewReader returns a Reader of src, whose errors name it what.
func NewReader(what string, src []byte) Reader { return Reader{what: what, buf: src} }

// Err returns the first error met, or nil.
func (r *Reader) Err() error { return r.err }

// Remaining returns how many bytes are left unread.
func (r *Reader) Remaining() int { return len(r.buf) }

// Fail records a corruption (unless one is recorded already) and returns
// the recorded error.
func (r *Reader) Fail(format string, args ...any) error {
	if r.err == nil {
		r.err = corrupt(r.what, format, args...)
	}
	return r.err
}

// Tag reads the format tag byte and fails unless it is want.
func (r *Reader) Tag(want byte) {
	if r.err != nil {
		return
	}
	if len(r.buf) == 0 {
		r.Fail("empty")
		return
	}
	if r.buf[0] != want {
		r.Fail("format tag %#02x, want %#02x", r.buf[0], want)
		return
	}
	r.buf = r.buf[1:]
}

func (r *Reader) count() int {
	if r.err != nil {
		return 0
	}
	if len(r.buf) == 0 {
		r.Fail("truncated before the dimension count")
		return 0
	}
	n := int(r.buf[0])
	r.buf = r.buf[1:]
	if n > ledger.MaxDimensions {
		r.Fail("%d dimensions, at most %d", n, ledger.MaxDimensions)
		return 0
	}
	return n
}

// Varint reads a signed varint.
func (r *Reader) Varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.buf)
	switch {
	case n == 0:
		r.Fail("truncated varint")
		return 0
	case n < 0:
		r.Fail("varint overflows 64 bits")
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf)
	switch {
	case n == 0:
		r.Fail("truncated uvarint")
		return 0
	case n < 0:
		r.Fail("uvarint overflows 64 bits")
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

// Bytes reads a uvarint length and that many bytes. The slice shares
// src's memory (capacity clipped).
func (r *Reader) Bytes() []byte {
	n := r.Uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.buf)) {
		r.Fail("%d bytes wanted, %d left", n, len(r.buf))
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

// Amounts reads one encoded Amounts (as DecodeAmounts decodes it whole)
// from where the reader is: values written back to back (the SQLite
// audit reads three in one column) are read one after the other.
func (r *Reader) Amounts() ledger.Amounts {
	var a ledger.Amounts
	r.Tag(TagAmountsV1)
	r.amountsBody(&a)
	return a
}

func (r *Reader) amountsBody(a *ledger.Amounts) {
	n := r.count()
	for i := 0; i < n; i++ {
		a[i] = r.Varint()
	}
}

// End fails when bytes are left unread: a value is exactly its encoding.
func (r *Reader) End() {
	if r.err == nil && len(r.buf) != 0 {
		r.Fail("%d trailing bytes", len(r.buf))
	}
}
