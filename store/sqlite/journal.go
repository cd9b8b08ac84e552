package sqlite

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/codec"
)

// The journal entries of one Write are stored as one row of
// journal_batches (schema version 3): one BLOB instead of one 11-column
// row per entry. Binding, inserting and logging a row per entry cost more
// than everything else a reserve writes; a batch's entries mostly name the
// same account, which the encoding writes once.
//
// Format (tagJournalBatchV1): the tag byte, the entry count (uvarint),
// then per entry:
//
//	at        varint, Unix nanoseconds (codec's convention, 0 = zero time)
//	          minus the previous entry's (the first: minus 0)
//	kind      uvarint (a byte)
//	account   uvarint k: 0 = a new key follows (subject, route, region as
//	          strings, generation as uvarint <= MaxInt64) and becomes
//	          number len(keys)+1 of this blob; k > 0 = key number k
//	reservation id, string
//	from, to  uvarint each (reservation states)
//	receipt id, string
//	delta     the number of dimensions written (trailing zero ones are
//	          not), then per dimension a uvarint mask of its non-zero
//	          terms (bit i: term i of ledger.Balance, Opening first)
//	          and those terms as varints, in order
//
// A string is its length (uvarint) and its bytes. Decoding never panics:
// anything else is an error wrapping codec.ErrCorrupt.
const tagJournalBatchV1 byte = 0xD1

// appendJournalBatch appends the encoding of entries to dst. It returns an
// error for a value the store cannot keep (a time outside codec's range or
// on the Unix epoch, a generation above MaxInt64).
func appendJournalBatch(dst []byte, entries []ledger.JournalEntry) ([]byte, error) {
	var (
		conv     codec.Conv
		prevAt   int64
		keys     []ledger.AccountKey
		keyIndex map[ledger.AccountKey]int // built once keys outgrows a linear search
		lastKey  = -1
	)
	dst = append(dst, tagJournalBatchV1)
	dst = binary.AppendUvarint(dst, uint64(len(entries)))
	for i := range entries {
		e := &entries[i]
		at := conv.Nanos(e.At)
		dst = binary.AppendVarint(dst, at-prevAt)
		prevAt = at
		dst = binary.AppendUvarint(dst, uint64(e.Kind))
		k := -1
		switch {
		case lastKey >= 0 && keys[lastKey] == e.Account:
			k = lastKey
		case keyIndex != nil:
			if j, ok := keyIndex[e.Account]; ok {
				k = j
			}
		default:
			for j := range keys {
				if keys[j] == e.Account {
					k = j
					break
				}
			}
		}
		if k >= 0 {
			dst = binary.AppendUvarint(dst, uint64(k+1))
		} else {
			dst = append(dst, 0)
			dst = appendString(dst, e.Account.Subject)
			dst = appendString(dst, e.Account.Route)
			dst = appendString(dst, e.Account.Region)
			dst = binary.AppendUvarint(dst, uint64(conv.Int(e.Account.Generation)))
			k = len(keys)
			keys = append(keys, e.Account)
			if keyIndex != nil {
				keyIndex[e.Account] = k
			} else if len(keys) > 8 {
				keyIndex = make(map[ledger.AccountKey]int, 2*len(keys))
				for j, key := range keys {
					keyIndex[key] = j
				}
			}
		}
		lastKey = k
		dst = appendString(dst, e.ReservationID)
		dst = binary.AppendUvarint(dst, uint64(e.From))
		dst = binary.AppendUvarint(dst, uint64(e.To))
		dst = appendString(dst, e.ReceiptID)
		dst = appendDelta(dst, &e.Delta)
	}
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("journal entry: %w", err)
	}
	return dst, nil
}

// balanceTerms lists a Balance's terms in the order of the delta mask.
func balanceTerms(b *ledger.Balance) [9]*ledger.Units {
	return [9]*ledger.Units{&b.Opening, &b.Minted, &b.OverdraftIssued, &b.Available, &b.Reserved, &b.Spent,
		&b.RetiredForEmergency, &b.RetiredForMove, &b.OverdraftRepaid}
}

// appendDelta appends a journal entry's delta: most of its terms are zero
// (a reserve moves units from available to reserved), so only the
// non-zero ones are written.
func appendDelta(dst []byte, d *ledger.Balances) []byte {
	n := len(d)
	for n > 0 && d[n-1] == (ledger.Balance{}) {
		n--
	}
	dst = append(dst, byte(n))
	for i := range n {
		terms := balanceTerms(&d[i])
		var mask uint64
		for t, v := range terms {
			if *v != 0 {
				mask |= 1 << t
			}
		}
		dst = binary.AppendUvarint(dst, mask)
		for _, v := range terms {
			if *v != 0 {
				dst = binary.AppendVarint(dst, *v)
			}
		}
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decodeJournalBatch appends the entries encoded in src to dst and returns
// the extended slice, or an error wrapping codec.ErrCorrupt when src is not
// exactly one batch this package wrote.
func decodeJournalBatch(dst []ledger.JournalEntry, src []byte) ([]ledger.JournalEntry, error) {
	d := journalDecoder{codec.NewReader("journal batch", src)}
	d.Tag(tagJournalBatchV1)
	count := d.Uvarint()
	// Every entry takes at least 8 bytes: no count beyond that is real,
	// and none may make the slice grow past what src can hold.
	if d.Err() == nil && count > uint64(d.Remaining())/8 {
		return dst, d.Fail("%d entries in %d bytes", count, d.Remaining())
	}
	var (
		conv codec.Conv
		at   int64
		keys []ledger.AccountKey
	)
	dst = slices.Grow(dst, int(count)) // amortized: Snapshot appends batch after batch
	for i := uint64(0); i < count && d.Err() == nil; i++ {
		var e ledger.JournalEntry
		at += d.Varint()
		e.At = conv.Time(at)
		e.Kind = conv.Kind(d.small())
		switch k := d.Uvarint(); {
		case d.Err() != nil:
		case k == 0:
			key := ledger.AccountKey{Subject: d.string(), Route: d.string(), Region: d.string()}
			key.Generation = conv.Uint(d.small())
			keys = append(keys, key)
			e.Account = key
		case k <= uint64(len(keys)):
			e.Account = keys[k-1]
		default:
			return dst, d.Fail("entry %d names account %d of %d", i, k, len(keys))
		}
		e.ReservationID = d.string()
		e.From = conv.State(d.small())
		e.To = conv.State(d.small())
		e.ReceiptID = d.string()
		d.delta(&e.Delta)
		if err := d.Err(); err != nil {
			return dst, err
		}
		if err := conv.Err(); err != nil {
			return dst, fmt.Errorf("journal batch entry %d: %w", i, err)
		}
		dst = append(dst, e)
	}
	d.End()
	return dst, d.Err()
}

// journalDecoder reads a journal batch with the stores' Reader, plus what
// this format adds: small unsigned fields, strings and sparse deltas.
type journalDecoder struct{ codec.Reader }

// small returns a uvarint that must fit an int64 (Conv checks the range
// each field allows).
func (d *journalDecoder) small() int64 {
	v := d.Uvarint()
	if v > math.MaxInt64 {
		d.Fail("value %d exceeds %d", v, int64(math.MaxInt64))
		return 0
	}
	return int64(v)
}

// delta reads what appendDelta wrote. A non-canonical encoding (a zero
// term or trailing zero dimension written) is corrupt: every blob of
// entries has one encoding.
func (d *journalDecoder) delta(out *ledger.Balances) {
	n := d.Uvarint()
	if d.Err() != nil {
		return
	}
	if n > ledger.MaxDimensions {
		d.Fail("%d dimensions, at most %d", n, ledger.MaxDimensions)
		return
	}
	for i := range int(n) {
		mask := d.Uvarint()
		if d.Err() != nil {
			return
		}
		if mask >= 1<<9 || i == int(n)-1 && mask == 0 {
			d.Fail("dimension %d: term mask %#x", i, mask)
			return
		}
		for t, v := range balanceTerms(&out[i]) {
			if mask&(1<<t) == 0 {
				continue
			}
			if *v = d.Varint(); d.Err() == nil && *v == 0 {
				d.Fail("dimension %d: term %d written as zero", i, t)
			}
		}
	}
}

func (d *journalDecoder) string() string { return string(d.Bytes()) }
