package sqlite

import (
	"encoding/binary"
	"errors"
	"hash/maphash"
	"time"

	"github.com/capledger/capledger/ledger"
)

// rowTable is one table of the row cache, used under rowCache.mu.
type rowTable[K comparable, T any] interface {
	// lookupRow returns a copy of the cached row (nil with found true when
	// the row is known not to exist); found is false when the key is not
	// cached. slot is where a packedTable found it (a hint for
	// rememberAt), noSlot otherwise.
	lookupRow(key K, clone func(*T) *T) (row *T, found bool, slot int32)
	// rememberRow caches a copy of row (nil: the row does not exist).
	rememberRow(key K, row *T, clone func(*T) *T)
	// has reports whether the key is cached (a row or its absence).
	has(key K) bool
}

// packedCodec encodes one table's keys and rows for a packedTable.
type packedCodec[K comparable, T any] struct {
	appendKey func(b []byte, key K) []byte
	// appendRow appends the row without its key.
	appendRow func(b []byte, row *T) []byte
	// decodeRow returns the row appendRow encoded in b, whose key is key.
	decodeRow func(b string, key K) (*T, error)
}

// packedSlot is one entry of a packedTable: the encoded key and, after it,
// a byte saying whether the row exists and the encoded row.
type packedSlot struct {
	hash uint64
	data string
}

func (s packedSlot) clockKey() uint64 { return s.hash }

// packedTable is a clockTable (the same bound and CLOCK eviction, clock)
// that keeps its rows encoded: a tenant (its account and its current
// generation, with their index entries) takes about 257 bytes instead of
// about 1,217 as structs (TestPackedCacheBytesPerTenant), so at the same
// memory about four times as many tenants stay cached, and a row costs a
// decode on each hit (see docs/PERFORMANCE.md, a million tenants). The
// index maps a hash of the encoded key to its slot; a slot holds the key
// itself, so a hit compares it and two keys with one hash only take each
// other's slot.
type packedTable[K comparable, T any] struct {
	clock[uint64, packedSlot]
	seed    maphash.Seed
	codec   packedCodec[K, T]
	scratch []byte
	// complete is set while the table holds every row of its SQL table,
	// so a key it does not hold does not exist (completeHeads); an
	// eviction, a key taking another's slot (one hash) and a reset clear
	// it.
	complete bool
}

func newPackedTable[K comparable, T any](limit int, codec packedCodec[K, T]) *packedTable[K, T] {
	return &packedTable[K, T]{clock: newClock[uint64, packedSlot](limit), seed: maphash.MakeSeed(), codec: codec}
}

// find encodes key into t.scratch and returns its hash, the slot its hash
// is indexed at (held: the hash is indexed) and whether that slot holds
// key (match; otherwise it holds another key with the same hash).
func (t *packedTable[K, T]) find(key K) (hash uint64, slot int32, held, match bool) {
	t.scratch = t.codec.appendKey(t.scratch[:0], key)
	hash = maphash.Bytes(t.seed, t.scratch)
	slot, held = t.slot(hash)
	if !held {
		return hash, 0, false, false
	}
	return hash, slot, true, t.holds(slot)
}

// holds reports whether slot i holds the key encoded in t.scratch. Keys
// are encoded prefix-free (length-prefixed strings, then varints), so a
// slot whose data starts with the key's encoding is that key's.
func (t *packedTable[K, T]) holds(i int32) bool {
	d := t.slots[i].data
	return len(d) > len(t.scratch) && d[:len(t.scratch)] == string(t.scratch)
}

// noSlot is the slot hint of a row not found in a packedTable.
const noSlot int32 = -1

func (t *packedTable[K, T]) has(key K) bool {
	_, _, _, match := t.find(key)
	return match
}

func (t *packedTable[K, T]) lookupRow(key K, _ func(*T) *T) (*T, bool, int32) {
	_, i, _, match := t.find(key)
	if !match {
		// In a complete table, a key not held is a row that does not
		// exist.
		return nil, t.complete, noSlot
	}
	t.touch(i)
	rest := t.slots[i].data[len(t.scratch):]
	if rest[0] == 0 {
		return nil, true, i
	}
	row, err := t.codec.decodeRow(rest[1:], key)
	if err != nil {
		// Only a bug of the codec gets here: forget the row, so it is
		// read from the file again.
		t.remove(i)
		t.complete = false
		return nil, false, noSlot
	}
	return row, true, i
}

func (t *packedTable[K, T]) rememberRow(key K, row *T, _ func(*T) *T) {
	t.rememberAt(key, row, noSlot)
}

// rememberAt is rememberRow for a key that lookupRow found at slot hint:
// when that slot still holds the key it is replaced without a look-up of
// the index (a million-entry map: a cache miss or two a row). Since the
// look-up the slot may have been evicted, refilled with another key, moved
// (remove) or emptied (reset), so it is checked; otherwise the key is
// looked up as rememberRow does.
func (t *packedTable[K, T]) rememberAt(key K, row *T, hint int32) {
	var (
		hash        uint64
		i           int32
		held, match bool
	)
	t.scratch = t.codec.appendKey(t.scratch[:0], key)
	if hint >= 0 && int(hint) < len(t.slots) && t.holds(hint) {
		hash, i, held, match = t.slots[hint].hash, hint, true, true
	} else {
		hash, i, held, match = t.find(key)
	}
	if held && !match {
		t.complete = false // the key takes another's slot: that one is no longer held
	}
	b := t.scratch
	if row == nil {
		b = append(b, 0)
	} else {
		b = t.codec.appendRow(append(b, 1), row)
	}
	t.scratch = b
	if held {
		// The key's slot, or another key's with the same hash: take it.
		t.set(i, packedSlot{hash: hash, data: string(b)})
		return
	}
	if t.add(packedSlot{hash: hash, data: string(b)}) {
		t.complete = false
	}
}

func (t *packedTable[K, T]) reset() {
	t.clock.reset()
	t.complete = false
}

var errPackedShort = errors.New("packed row: short")

// packedReader decodes what the append functions below encoded; the
// first failure sticks.
type packedReader struct {
	b   string
	err error
}

// uvarint reads what binary.AppendUvarint wrote.
func (r *packedReader) uvarint() uint64 {
	var v uint64
	for i := 0; i < len(r.b) && i < binary.MaxVarintLen64; i++ {
		c := r.b[i]
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			r.b = r.b[i+1:]
			return v
		}
	}
	if r.err == nil {
		r.err = errPackedShort
	}
	r.b = ""
	return 0
}

// varint reads what binary.AppendVarint wrote (zigzag).
func (r *packedReader) varint() int64 {
	u := r.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func appendPackedString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendPolicyKey(b []byte, k ledger.PolicyKey) []byte {
	return appendPackedString(appendPackedString(appendPackedString(b, k.Subject), k.Route), k.Region)
}

func appendAccountKey(b []byte, k ledger.AccountKey) []byte {
	return binary.AppendUvarint(appendPolicyKey(b, k.SubjectKey()), k.Generation)
}

// appendPackedInts appends the nonzero values of vs: a mask of which are
// nonzero, then each as a varint. Balances past the account's dimensions,
// most terms of a fresh account and the refill cursors of unused
// dimensions are zero and take no bytes.
func appendPackedInts(b []byte, vs []int64) []byte {
	var mask uint64
	for i, v := range vs {
		if v != 0 {
			mask |= 1 << i
		}
	}
	b = binary.AppendUvarint(b, mask)
	for _, v := range vs {
		if v != 0 {
			b = binary.AppendVarint(b, v)
		}
	}
	return b
}

func (r *packedReader) ints(vs []int64) {
	mask := r.uvarint()
	for i := range vs {
		if mask&(1<<i) != 0 {
			vs[i] = r.varint()
		}
	}
	if mask>>len(vs) != 0 && r.err == nil {
		r.err = errors.New("packed row: mask past its values")
	}
}

func appendPackedBalances(b []byte, bs *ledger.Balances) []byte {
	var vs [ledger.MaxDimensions * 9]int64
	for d := range bs {
		for i, term := range balanceTerms(&bs[d]) {
			vs[d*9+i] = *term
		}
	}
	return appendPackedInts(b, vs[:])
}

func (r *packedReader) balances(bs *ledger.Balances) {
	var vs [ledger.MaxDimensions * 9]int64
	r.ints(vs[:])
	for d := range bs {
		for i, term := range balanceTerms(&bs[d]) {
			*term = vs[d*9+i]
		}
	}
}

// accountCodec packs an account as read from the file: its epoch start
// as Unix nanoseconds (UTC, no monotonic reading; zero for the zero time),
// as scanAccount returns it.
var accountCodec = packedCodec[ledger.AccountKey, ledger.Account]{
	appendKey: appendAccountKey,
	appendRow: func(b []byte, a *ledger.Account) []byte {
		var start int64
		if !a.EpochStart.IsZero() {
			start = a.EpochStart.UnixNano()
		}
		b = binary.AppendUvarint(b, uint64(a.Dims))
		b = binary.AppendVarint(b, start)
		b = binary.AppendUvarint(b, a.Version)
		b = binary.AppendVarint(b, a.Breaches)
		b = appendPackedInts(b, a.RefilledTo[:])
		b = appendPackedBalances(b, &a.Balances)
		b = appendPackedBalances(b, &a.EpochOpening)
		return appendPackedInts(b, a.HeldElsewhere[:])
	},
	decodeRow: func(b string, key ledger.AccountKey) (*ledger.Account, error) {
		r := packedReader{b: b}
		a := &ledger.Account{Key: key}
		a.Dims = int(r.uvarint())
		if start := r.varint(); start != 0 {
			a.EpochStart = time.Unix(0, start).UTC()
		}
		a.Version = r.uvarint()
		a.Breaches = r.varint()
		r.ints(a.RefilledTo[:])
		r.balances(&a.Balances)
		r.balances(&a.EpochOpening)
		r.ints(a.HeldElsewhere[:])
		if r.err == nil && len(r.b) != 0 {
			r.err = errors.New("packed row: bytes past the account")
		}
		return a, r.err
	},
}

// headCodec packs a policy key's head: its active and latest generations.
var headCodec = packedCodec[ledger.PolicyKey, ledger.PolicyHead]{
	appendKey: appendPolicyKey,
	appendRow: func(b []byte, h *ledger.PolicyHead) []byte {
		return binary.AppendUvarint(binary.AppendUvarint(b, h.Active), h.Latest)
	},
	decodeRow: func(b string, key ledger.PolicyKey) (*ledger.PolicyHead, error) {
		r := packedReader{b: b}
		h := &ledger.PolicyHead{Key: key}
		h.Active = r.uvarint()
		h.Latest = r.uvarint()
		if r.err == nil && len(r.b) != 0 {
			r.err = errors.New("packed row: bytes past the head")
		}
		return h, r.err
	},
}

// currentCodec packs a subject's current generation.
var currentCodec = packedCodec[ledger.PolicyKey, uint64]{
	appendKey: appendPolicyKey,
	appendRow: func(b []byte, g *uint64) []byte { return binary.AppendUvarint(b, *g) },
	decodeRow: func(b string, _ ledger.PolicyKey) (*uint64, error) {
		r := packedReader{b: b}
		g := r.uvarint()
		if r.err == nil && len(r.b) != 0 {
			r.err = errors.New("packed row: bytes past the generation")
		}
		return &g, r.err
	},
}
