package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"pgregory.net/rapid"
)

func drawInt64(t *rapid.T, label string) int64 {
	// Mix small values (the common case, one-byte varints) with the
	// extremes, where zig-zag and overflow bugs live.
	return rapid.OneOf(rapid.Int64Range(-1000, 1000), rapid.Int64(),
		rapid.SampledFrom([]int64{math.MinInt64, math.MaxInt64, 0, -1})).Draw(t, label)
}

func drawAmounts(t *rapid.T, label string) ledger.Amounts {
	var a ledger.Amounts
	n := rapid.IntRange(0, ledger.MaxDimensions).Draw(t, label+".dims")
	for i := 0; i < n; i++ {
		a[i] = drawInt64(t, label)
	}
	// Holes (a zero dimension before a non-zero one) must survive too.
	if n > 1 && rapid.Bool().Draw(t, label+".hole") {
		a[0] = 0
	}
	return a
}

func drawBalances(t *rapid.T, label string) ledger.Balances {
	var b ledger.Balances
	n := rapid.IntRange(0, ledger.MaxDimensions).Draw(t, label+".dims")
	for i := 0; i < n; i++ {
		for _, term := range []*int64{&b[i].Opening, &b[i].Minted, &b[i].OverdraftIssued, &b[i].Available,
			&b[i].Reserved, &b[i].Spent, &b[i].RetiredForEmergency, &b[i].RetiredForMove, &b[i].OverdraftRepaid} {
			*term = drawInt64(t, label)
		}
	}
	return b
}

func TestAmountsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := drawAmounts(t, "a")
		enc := EncodeAmounts(&a)
		got, err := DecodeAmounts(enc)
		if err != nil {
			t.Fatalf("decode %x: %v", enc, err)
		}
		if got != a {
			t.Fatalf("round trip: %v -> %x -> %v", a, enc, got)
		}
		// Appending to a non-empty buffer must not disturb what is there.
		prefix := []byte{1, 2, 3}
		if app := AppendAmounts(prefix, &a); !bytes.Equal(app[:3], []byte{1, 2, 3}) || !bytes.Equal(app[3:], enc) {
			t.Fatalf("append: %x, want 010203%x", app, enc)
		}
	})
}

// CutAmounts reads an encoded Amounts back from the front of whatever
// follows it, and agrees with DecodeAmounts.
func TestCutAmountsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := drawAmounts(t, "a")
		after := rapid.SliceOf(rapid.Byte()).Draw(t, "after")
		enc := AppendAmounts(nil, &a)
		got, rest, err := CutAmounts(append(enc, after...))
		if err != nil || got != a || !bytes.Equal(rest, after) {
			t.Fatalf("cut %x then %x: %v, rest %x, %v", enc, after, got, rest, err)
		}
		if dec, err := DecodeAmounts(enc); err != nil || dec != got {
			t.Fatalf("DecodeAmounts %x: %v, %v; CutAmounts %v", enc, dec, err, got)
		}
	})
}

func TestBalancesRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := drawBalances(t, "b")
		enc := EncodeBalances(&b)
		got, err := DecodeBalances(enc)
		if err != nil {
			t.Fatalf("decode %x: %v", enc, err)
		}
		if got != b {
			t.Fatalf("round trip: %v -> %x -> %v", b, enc, got)
		}
	})
}

func TestShardAmountsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := ledger.Shard{Allocated: drawAmounts(t, "allocated"), Spent: drawAmounts(t, "spent"),
			Unknown: drawAmounts(t, "unknown"), Reminted: drawAmounts(t, "reminted")}
		var out ledger.Shard
		if err := DecodeShardAmounts(EncodeShardAmounts(&in), &out); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("round trip: %+v -> %+v", in, out)
		}
	})
}

func TestDimensionsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, ledger.MaxDimensions).Draw(t, "n")
		var dims []ledger.Dimension
		for i := 0; i < n; i++ {
			dims = append(dims, ledger.Dimension{
				Unit:           rapid.String().Draw(t, "unit"),
				RefillUnits:    drawInt64(t, "refill"),
				RefillInterval: time.Duration(drawInt64(t, "interval")),
				Burst:          drawInt64(t, "burst"),
				MaxReservation: drawInt64(t, "max"),
				MaxOverdraft:   drawInt64(t, "overdraft"),
			})
		}
		enc, err := EncodeDimensions(dims)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeDimensions(enc)
		if err != nil {
			t.Fatalf("decode %s: %v", enc, err)
		}
		if !reflect.DeepEqual(got, dims) {
			t.Fatalf("round trip: %+v -> %s -> %+v", dims, enc, got)
		}
	})
}

// The compact form is what makes hot rows cheap: check the sizes the
// package doc promises, so a regression to a fixed-width layout fails.
func TestEncodingIsCompact(t *testing.T) {
	one := ledger.Balances{{Opening: 1000, Minted: 60, Available: 800, Spent: 200, Reserved: 60}}
	// Tag, count, then nine varints: 1000, 800 and 200 take two bytes as
	// zig-zag varints, 60 and each zero one.
	if got := len(EncodeBalances(&one)); got != 2+2+1+1+2+1+2+1+1+1 {
		t.Fatalf("one-dimension balances take %d bytes", got)
	}
	var zero ledger.Balances
	if got := EncodeBalances(&zero); !bytes.Equal(got, []byte{TagBalancesV1, 0}) {
		t.Fatalf("zero balances: %x", got)
	}
	a := ledger.Amounts{600}
	if got := EncodeAmounts(&a); !bytes.Equal(got, []byte{TagAmountsV1, 1, 0xb0, 0x09}) {
		t.Fatalf("amounts {600}: %x", got)
	}
}

func TestDecodeRejects(t *testing.T) {
	four := ledger.Amounts{1, 2, 3, 4}
	valid := EncodeAmounts(&four)
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"wrong tag", append([]byte{TagBalancesV1}, valid[1:]...)},
		{"future version", append([]byte{TagAmountsV1 + 1}, valid[1:]...)},
		{"too many dimensions", []byte{TagAmountsV1, 5, 0, 0, 0, 0, 0}},
		{"truncated", valid[:len(valid)-1]},
		{"no count", []byte{TagAmountsV1}},
		{"trailing", append(append([]byte{}, valid...), 0)},
		{"overlong varint", []byte{TagAmountsV1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
	} {
		if _, err := DecodeAmounts(tc.in); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %x decoded with err %v, want ErrCorrupt", tc.name, tc.in, err)
		}
		if a, rest, err := CutAmounts(tc.in); tc.name != "trailing" && (!errors.Is(err, ErrCorrupt) || rest != nil || a != (ledger.Amounts{})) {
			t.Errorf("%s: %x cut to %v, rest %x, err %v, want ErrCorrupt", tc.name, tc.in, a, rest, err)
		}
	}
	if _, err := DecodeBalances(EncodeAmounts(&four)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("amounts decoded as balances: %v", err)
	}
	var s ledger.Shard
	s.Allocated = ledger.Amounts{9}
	if err := DecodeShardAmounts([]byte{TagShardAmountsV1, 1, 2}, &s); !errors.Is(err, ErrCorrupt) || s.Allocated[0] != 9 {
		t.Errorf("truncated shard amounts: err %v, shard changed to %+v", err, s)
	}
	for _, doc := range []string{``, `{}`, `{"v":2,"dimensions":[]}`, `{"v":1,"dimensions":[{"unit":"a","bogus":1}]}`,
		`{"v":1,"dimensions":[{},{},{},{},{}]}`, `{"v":1,"dimensions":[]} {}`, `[1,2]`} {
		if _, err := DecodeDimensions([]byte(doc)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("dimensions %q: err %v, want ErrCorrupt", doc, err)
		}
	}
	if _, err := EncodeDimensions([]ledger.Dimension{{Unit: "tok\xffens"}}); err == nil {
		t.Error("encoded a unit that is not UTF-8 (JSON would have replaced the byte)")
	}
	if _, err := EncodeDimensions(make([]ledger.Dimension, ledger.MaxDimensions+1)); err == nil {
		t.Error("encoded five dimensions")
	}
	if _, err := DecodeSignature(make([]byte, MaxSignatureLen+1)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("oversized signature: %v", err)
	}
}

func TestSignature(t *testing.T) {
	if got := EncodeSignature(nil); got == nil || len(got) != 0 {
		t.Fatalf("nil signature encodes as %#v, want empty non-nil", got)
	}
	if got, err := DecodeSignature([]byte{}); err != nil || got != nil {
		t.Fatalf("empty signature decodes as %#v, %v", got, err)
	}
	stored := []byte{1, 2, 3}
	got, err := DecodeSignature(stored)
	if err != nil || !bytes.Equal(got, stored) {
		t.Fatalf("decode: %x, %v", got, err)
	}
	stored[0] = 9 // a driver may reuse its scan buffer
	if got[0] != 1 {
		t.Fatal("decoded signature aliases the stored bytes")
	}
}

func TestConvTimes(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		paris = time.FixedZone("CEST", 2*3600)
	}
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.Int64().Draw(rt, "nanos")
		if n == 0 {
			return
		}
		in := time.Unix(0, n).In(paris)
		var c Conv
		got := c.Time(c.Nanos(in))
		if c.Err() != nil {
			rt.Fatal(c.Err())
		}
		if got != in.UTC() || got.Location() != time.UTC {
			rt.Fatalf("%v round-trips to %v", in, got)
		}
	})
	var c Conv
	if c.Nanos(time.Time{}) != 0 || !c.Time(0).IsZero() || c.Err() != nil {
		t.Fatal("zero time does not map to 0")
	}
	withMono := time.Now() // carries a monotonic reading; storage drops it
	if got := c.Time(c.Nanos(withMono)); !got.Equal(withMono) || got != withMono.UTC() {
		t.Fatalf("%v round-trips to %v", withMono, got)
	}
	for _, bad := range []time.Time{MinTime.Add(-1), MaxTime.Add(1), time.Unix(0, 0)} {
		var c Conv
		c.Nanos(bad)
		if c.Err() == nil {
			t.Errorf("Nanos(%v) recorded no error", bad)
		}
	}
}

func TestConvScalars(t *testing.T) {
	var c Conv
	if c.Uint(c.Int(math.MaxInt64)) != math.MaxInt64 || c.Err() != nil {
		t.Fatalf("MaxInt64: %v", c.Err())
	}
	c.Int(math.MaxInt64 + 1)
	first := c.Err()
	if first == nil {
		t.Fatal("Int(MaxInt64+1) recorded no error")
	}
	c.Uint(-1)
	if c.Err() != first {
		t.Fatal("a later error replaced the first one")
	}
	for _, tc := range []struct {
		name string
		f    func(*Conv)
	}{
		{"negative counter", func(c *Conv) { c.Uint(-1) }},
		{"dims", func(c *Conv) { c.Dims(ledger.MaxDimensions + 1) }},
		{"state", func(c *Conv) { c.State(int64(ledger.StateReservationUnknown) + 1) }},
		{"kind", func(c *Conv) { c.Kind(256) }},
		{"move kind", func(c *Conv) { c.MoveKind(-1) }},
		{"amounts", func(c *Conv) { c.Amounts([]byte{1}) }},
		{"balances", func(c *Conv) { c.Balances(nil) }},
		{"dimensions", func(c *Conv) { c.Dimensions([]byte("x")) }},
		{"shard", func(c *Conv) { c.ShardAmounts(nil, &ledger.Shard{}) }},
		{"signature", func(c *Conv) { c.Signature(make([]byte, MaxSignatureLen+1)) }},
		{"encode dimensions", func(c *Conv) { c.EncodeDimensions(make([]ledger.Dimension, 5)) }},
	} {
		var c Conv
		tc.f(&c)
		if c.Err() == nil {
			t.Errorf("%s: no error recorded", tc.name)
		}
	}
	var ok Conv
	if ok.State(int64(ledger.StateReservationUnknown)) != ledger.StateReservationUnknown || ok.Err() != nil {
		t.Fatalf("the last state, RESERVATION_UNKNOWN: %v", ok.Err())
	}
	if ok.State(int64(ledger.StateUsageUnknown)) != ledger.StateUsageUnknown || ok.Dims(4) != 4 ||
		ok.Kind(int64(ledger.KindSettle)) != ledger.KindSettle || ok.MoveKind(3) != ledger.MoveShardRemint ||
		ok.Bool(true) != 1 || ok.Bool(false) != 0 || ok.Err() != nil {
		t.Fatalf("valid scalars: %v", ok.Err())
	}
}

// Reader.Bytes refuses a length past what is left, the first byte past
// included, without slicing beyond its buffer.
func TestReaderBytesRefusesALengthPastTheEnd(t *testing.T) {
	for left := range 3 {
		src := append(binary.AppendUvarint(nil, uint64(left+1)), make([]byte, left)...)
		r := NewReader("bytes", src)
		if b := r.Bytes(); !errors.Is(r.Err(), ErrCorrupt) || b != nil {
			t.Fatalf("length %d with %d bytes left: %q, %v", left+1, left, b, r.Err())
		}
	}
	r := NewReader("bytes", append(binary.AppendUvarint(nil, 2), 'a', 'b'))
	if b := r.Bytes(); string(b) != "ab" || r.Err() != nil || r.Remaining() != 0 {
		t.Fatalf("length 2 with 2 bytes: %q, %v", b, r.Err())
	}
}
