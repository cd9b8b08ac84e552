package codec

import (
	"errors"
	"reflect"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// FuzzDecode feeds arbitrary bytes to every decoder: none may panic, every
// failure must wrap ErrCorrupt, and whatever decodes must re-encode to a
// value that decodes to the same thing (decoding is a function of the
// value, not of how it happened to be written).
func FuzzDecode(f *testing.F) {
	bal := ledger.Balances{{Opening: 1000, Minted: 60, Available: 800, Spent: 200, Reserved: 60}, {Available: -1}}
	amt := ledger.Amounts{600, 0, -7, 1 << 62}
	sh := ledger.Shard{Allocated: ledger.Amounts{100}, Spent: ledger.Amounts{40}, Unknown: ledger.Amounts{10}, Reminted: ledger.Amounts{50}}
	dims, _ := EncodeDimensions([]ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: 1e9}})
	for _, seed := range [][]byte{EncodeBalances(&bal), EncodeAmounts(&amt), EncodeShardAmounts(&sh), dims, nil, {0xA1, 4}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if a, err := DecodeAmounts(in); err == nil {
			if again, err := DecodeAmounts(EncodeAmounts(&a)); err != nil || again != a {
				t.Fatalf("amounts %x: %v re-decodes as %v, %v", in, a, again, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("amounts %x: %v does not wrap ErrCorrupt", in, err)
		}
		if b, err := DecodeBalances(in); err == nil {
			if again, err := DecodeBalances(EncodeBalances(&b)); err != nil || again != b {
				t.Fatalf("balances %x: %v re-decodes as %v, %v", in, b, again, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("balances %x: %v does not wrap ErrCorrupt", in, err)
		}
		var s ledger.Shard
		if err := DecodeShardAmounts(in, &s); err == nil {
			var again ledger.Shard
			if err := DecodeShardAmounts(EncodeShardAmounts(&s), &again); err != nil || !reflect.DeepEqual(again, s) {
				t.Fatalf("shard amounts %x: %+v re-decodes as %+v, %v", in, s, again, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("shard amounts %x: %v does not wrap ErrCorrupt", in, err)
		}
		if d, err := DecodeDimensions(in); err == nil {
			enc, err := EncodeDimensions(d)
			if err != nil {
				t.Fatalf("dimensions %q decode but do not encode: %v", in, err)
			}
			if again, err := DecodeDimensions(enc); err != nil || !reflect.DeepEqual(again, d) {
				t.Fatalf("dimensions %q: %+v re-decodes as %+v, %v", in, d, again, err)
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("dimensions %q: %v does not wrap ErrCorrupt", in, err)
		}
		if _, err := DecodeSignature(in); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("signature: %v does not wrap ErrCorrupt", err)
		}
	})
}
