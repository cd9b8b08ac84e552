package ledger_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

var signT0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

// signedShard returns a shard signed with shardKey under key id "k1".
func signedShard() *ledger.Shard {
	s := &ledger.Shard{
		ID:        "sh-01J0000000000000000000000",
		Account:   ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: 31},
		GatewayID: "gw-eu-1",
		BootEpoch: 4,
		Fence:     9,
		Allocated: ledger.Amounts{5000, 20},
		IssuedAt:  signT0,
		ExpiresAt: signT0.Add(10 * time.Minute),
		KeyID:     "k1",
	}
	s.Signature = ed25519.Sign(shardKey, ledger.ShardCanonical(s))
	return s
}

var holder = ledger.ShardHolder{GatewayID: "gw-eu-1", BootEpoch: 4, NewestFence: 9}

func TestShardCanonicalLayout(t *testing.T) {
	s := signedShard()
	got := ledger.ShardCanonical(s)
	// Spell the documented layout out by hand.
	var want []byte
	str := func(v string) {
		want = binary.BigEndian.AppendUint32(want, uint32(len(v)))
		want = append(want, v...)
	}
	u64 := func(v uint64) { want = binary.BigEndian.AppendUint64(want, v) }
	str("emergencyShard.v1")
	str(s.ID)
	str("tenant-7")
	str("chat.generate")
	str("eu")
	u64(31)
	str("gw-eu-1")
	u64(4)
	u64(9)
	for _, a := range []uint64{5000, 20, 0, 0} {
		u64(a)
	}
	u64(uint64(signT0.UnixNano()))
	u64(uint64(signT0.Add(10 * time.Minute).UnixNano()))
	str("k1")
	if !bytes.Equal(got, want) {
		t.Fatalf("canonical encoding differs from the documented layout:\n got %x\nwant %x", got, want)
	}
}

func TestShardTokenRoundTrip(t *testing.T) {
	s := signedShard()
	token := ledger.EncodeShardToken(s)
	back, err := ledger.DecodeShardToken(token)
	if err != nil {
		t.Fatal(err)
	}
	if back.ID != s.ID || back.Account != s.Account || back.GatewayID != s.GatewayID || back.BootEpoch != s.BootEpoch ||
		back.Fence != s.Fence || back.Allocated != s.Allocated || !back.IssuedAt.Equal(s.IssuedAt) ||
		!back.ExpiresAt.Equal(s.ExpiresAt) || back.KeyID != s.KeyID || !bytes.Equal(back.Signature, s.Signature) {
		t.Fatalf("decoded %+v, encoded %+v", back, s)
	}
	if again := ledger.EncodeShardToken(back); !bytes.Equal(again, token) {
		t.Fatal("a decoded token does not re-encode to the same bytes")
	}
	if err := ledger.VerifyShard(back, shardKeys, holder, signT0); err != nil {
		t.Fatalf("decoded token does not verify: %v", err)
	}
}

func TestShardDecodeRefusesMalformed(t *testing.T) {
	token := ledger.EncodeShardToken(signedShard())
	for n := 0; n < len(token); n++ {
		if _, err := ledger.DecodeShardToken(token[:n]); !errors.Is(err, ledger.ErrShardMalformed) {
			t.Fatalf("token truncated to %d of %d bytes: %v", n, len(token), err)
		}
	}
	if _, err := ledger.DecodeShardToken(append(bytes.Clone(token), 0)); !errors.Is(err, ledger.ErrShardMalformed) {
		t.Fatalf("trailing byte: %v", err)
	}
	wrongSchema := bytes.Clone(token)
	wrongSchema[4+len("emergencyShard.v")] = '2'
	if _, err := ledger.DecodeShardToken(wrongSchema); !errors.Is(err, ledger.ErrShardMalformed) {
		t.Fatalf("schema v2: %v", err)
	}
	s := signedShard()
	s.GatewayID = "gw-\xff"
	if _, err := ledger.DecodeShardToken(ledger.EncodeShardToken(s)); !errors.Is(err, ledger.ErrShardMalformed) {
		t.Fatalf("non-UTF-8 gateway id: %v", err)
	}
	s = signedShard()
	s.Allocated[1] = -1
	if _, err := ledger.DecodeShardToken(ledger.EncodeShardToken(s)); !errors.Is(err, ledger.ErrShardMalformed) {
		t.Fatalf("negative allocation: %v", err)
	}
	// Each string is bounded by MaxShardString even where the token is
	// well under MaxShardToken.
	s = signedShard()
	s.Account.Subject = string(bytes.Repeat([]byte("s"), ledger.MaxShardString))
	if _, err := ledger.DecodeShardToken(ledger.EncodeShardToken(s)); err != nil {
		t.Fatalf("a subject of MaxShardString bytes: %v", err)
	}
	s.Account.Subject += "s"
	if _, err := ledger.DecodeShardToken(ledger.EncodeShardToken(s)); !errors.Is(err, ledger.ErrShardMalformed) {
		t.Fatalf("a subject of MaxShardString+1 bytes: %v", err)
	}
	huge := binary.BigEndian.AppendUint32(nil, 1<<31)
	if _, err := ledger.DecodeShardToken(huge); !errors.Is(err, ledger.ErrShardMalformed) {
		t.Fatalf("2 GiB schema length: %v", err)
	}
}

func TestVerifyShardRejectsEveryFieldChange(t *testing.T) {
	if err := ledger.VerifyShard(signedShard(), shardKeys, holder, signT0); err != nil {
		t.Fatalf("untouched shard: %v", err)
	}
	// A verifier holding the other key too, so that a changed key id is a
	// signature failure and not merely an unknown key.
	other, _, _ := ed25519.GenerateKey(bytes.NewReader(bytes.Repeat([]byte{9}, 64)))
	rotated := ledger.ShardKeyRing{"k1": shardKeys["k1"], "k2": other}
	mutations := map[string]func(*ledger.Shard){
		"id":         func(s *ledger.Shard) { s.ID += "x" },
		"subject":    func(s *ledger.Shard) { s.Account.Subject = "tenant-8" },
		"route":      func(s *ledger.Shard) { s.Account.Route = "embed" },
		"region":     func(s *ledger.Shard) { s.Account.Region = "us" },
		"generation": func(s *ledger.Shard) { s.Account.Generation++ },
		"allocated0": func(s *ledger.Shard) { s.Allocated[0]++ },
		"allocated3": func(s *ledger.Shard) { s.Allocated[3] = 1 },
		"issued":     func(s *ledger.Shard) { s.IssuedAt = s.IssuedAt.Add(time.Nanosecond) },
		"expires":    func(s *ledger.Shard) { s.ExpiresAt = s.ExpiresAt.Add(time.Hour) },
		"key id":     func(s *ledger.Shard) { s.KeyID = "k2" },
		"signature":  func(s *ledger.Shard) { s.Signature[10] ^= 1 },
		"short sig":  func(s *ledger.Shard) { s.Signature = s.Signature[:63] },
		// Changing who the shard is for must not make it verify for the
		// new holder either.
		"gateway": func(s *ledger.Shard) { s.GatewayID = "gw-eu-2" },
		"boot":    func(s *ledger.Shard) { s.BootEpoch = 5 },
		"fence":   func(s *ledger.Shard) { s.Fence = 10 },
	}
	for name, mutate := range mutations {
		s := signedShard()
		mutate(s)
		h := ledger.ShardHolder{GatewayID: s.GatewayID, BootEpoch: s.BootEpoch, NewestFence: s.Fence}
		if err := ledger.VerifyShard(s, rotated, h, signT0); !errors.Is(err, ledger.ErrShardSignature) {
			t.Errorf("%s changed: %v, want ErrShardSignature", name, err)
		}
	}
}

func TestVerifyShardBinding(t *testing.T) {
	s := signedShard()
	cases := []struct {
		name   string
		keys   ledger.ShardKeys
		holder ledger.ShardHolder
		now    time.Time
		want   error
	}{
		{"unknown key", ledger.ShardKeyRing{"k0": shardKeys["k1"]}, holder, signT0, ledger.ErrShardUnknownKey},
		{"no keys", nil, holder, signT0, ledger.ErrShardUnknownKey},
		{"another gateway", shardKeys, ledger.ShardHolder{GatewayID: "gw-eu-2", BootEpoch: 4}, signT0, ledger.ErrShardForeign},
		{"restarted gateway", shardKeys, ledger.ShardHolder{GatewayID: "gw-eu-1", BootEpoch: 5}, signT0, ledger.ErrShardBootEpoch},
		{"newer fence held", shardKeys, ledger.ShardHolder{GatewayID: "gw-eu-1", BootEpoch: 4, NewestFence: 10}, signT0, ledger.ErrShardFenced},
		{"at expiry", shardKeys, holder, s.ExpiresAt, ledger.ErrShardExpired},
		{"after expiry", shardKeys, holder, s.ExpiresAt.Add(time.Second), ledger.ErrShardExpired},
		{"just before expiry", shardKeys, holder, s.ExpiresAt.Add(-time.Nanosecond), nil},
		{"older fence held", shardKeys, ledger.ShardHolder{GatewayID: "gw-eu-1", BootEpoch: 4, NewestFence: 3}, signT0, nil},
	}
	for _, tc := range cases {
		err := ledger.VerifyShard(s, tc.keys, tc.holder, tc.now)
		if (tc.want == nil && err != nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzShardToken feeds arbitrary bytes to the decoder and the verifier: the
// decoder never panics, a decoded token re-encodes to the same bytes, and
// the only input that verifies is the token that was signed (any mutation
// of it fails).
func FuzzShardToken(f *testing.F) {
	good := ledger.EncodeShardToken(signedShard())
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, token []byte) {
		s, err := ledger.DecodeShardToken(token)
		if err != nil {
			if !errors.Is(err, ledger.ErrShardMalformed) {
				t.Fatalf("decode error %v does not wrap ErrShardMalformed", err)
			}
			return
		}
		if again := ledger.EncodeShardToken(s); !bytes.Equal(again, token) {
			t.Fatalf("token %x decodes to %+v, which encodes to %x", token, s, again)
		}
		h := ledger.ShardHolder{GatewayID: s.GatewayID, BootEpoch: s.BootEpoch}
		if err := ledger.VerifyShard(s, shardKeys, h, s.IssuedAt); err == nil && !bytes.Equal(token, good) {
			t.Fatalf("a token that was never signed verifies: %x", token)
		}
	})
}

// BenchmarkVerifyShard measures what a gateway pays to verify a shard
// (decode + Ed25519 verification + binding checks).
func BenchmarkVerifyShard(b *testing.B) {
	token := ledger.EncodeShardToken(signedShard())
	for b.Loop() {
		s, err := ledger.DecodeShardToken(token)
		if err != nil {
			b.Fatal(err)
		}
		if err := ledger.VerifyShard(s, shardKeys, holder, signT0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkShardLocalReserveSettle measures one local admission cycle
// (reserve, start, settle) of the pure shard-local ledger.
func BenchmarkShardLocalReserveSettle(b *testing.B) {
	s := signedShard()
	s.Allocated = ledger.Amounts{ledger.MaxUnits}
	l := ledger.NewShardLocal(s)
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "r" + strconv.Itoa(i)
	}
	i := 0
	for b.Loop() {
		if i == len(ids) {
			b.StopTimer()
			l = ledger.NewShardLocal(s)
			i = 0
			b.StartTimer()
		}
		id := ids[i]
		i++
		l.Reserve(id, "d", ledger.Amounts{10}, signT0)
		l.Start(id, "op", signT0)
		if res := l.Settle(id, "op", ledger.Amounts{7}, signT0); res.Err != nil {
			b.Fatal(res.Err)
		}
	}
}

// A key ring entry that is not an Ed25519 public key (a truncated or
// mistyped key) is an unknown key, not a panic in ed25519.Verify.
func TestShardKeyRingRefusesAMalformedKey(t *testing.T) {
	s := signedShard()
	pub := shardKey.Public().(ed25519.PublicKey)
	ring := ledger.ShardKeyRing{"k1": pub[:ed25519.PublicKeySize-1]}
	if _, ok := ring.ShardPublicKey("k1"); ok {
		t.Fatal("a 31-byte key was handed out")
	}
	if err := ledger.VerifyShardSignature(s, ring); !errors.Is(err, ledger.ErrShardUnknownKey) {
		t.Fatalf("verify with a 31-byte key: %v", err)
	}
}
