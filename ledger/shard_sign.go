package ledger

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Shard verification outcomes. VerifyShard returns exactly one of these
// (wrapped with detail) for a shard it refuses.
var (
	// ErrShardSignature: the signature does not match the shard's fields
	// (a field was changed, or the signature itself).
	ErrShardSignature = errors.New("shard signature does not verify")
	// ErrShardUnknownKey: the shard names a key id the verifier does not
	// hold (never issued, or removed after rotation).
	ErrShardUnknownKey = errors.New("shard signed with an unknown key")
	// ErrShardExpired: the shard's expiry has passed.
	ErrShardExpired = errors.New("shard expired")
	// ErrShardBootEpoch: the shard was issued to another process (boot
	// epoch) of the gateway; a restarted process never inherits a shard.
	ErrShardBootEpoch = errors.New("shard issued to another boot of the gateway")
	// ErrShardFenced: the gateway already holds a shard with a newer fence.
	ErrShardFenced = errors.New("shard fenced by a newer issuance")
	// ErrShardMalformed: the bytes are not an emergencyShard.v1 token.
	ErrShardMalformed = errors.New("malformed shard")
)

// Limits of the canonical encoding; the decoder refuses anything larger,
// so a hostile token cannot make it allocate much.
const (
	// MaxShardString bounds every string field (ids, subject, route,
	// region, gateway id, key id) in bytes.
	MaxShardString = 1024
	// MaxShardToken bounds a whole token.
	MaxShardToken = 16 << 10
)

// ShardCanonical returns the canonical encoding of the signed fields of s,
// the exact bytes an emergencyShard.v1 signature covers. Fields come in
// this fixed order; strings are a 4-byte big-endian length followed by
// their UTF-8 bytes, integers are 8-byte big-endian (two's complement for
// signed ones), times are Unix nanoseconds as signed integers:
//
//	string  schema         "emergencyShard.v1"
//	string  shard id
//	string  subject
//	string  route
//	string  region
//	uint64  policy generation
//	string  gateway id
//	uint64  boot epoch
//	uint64  fence
//	int64   allocated[0] .. allocated[3]   (always MaxDimensions = 4 amounts,
//	                                        in the policy's dimension order,
//	                                        zero past its dimension count)
//	int64   issued at
//	int64   expires at
//	string  key id
//
// Nothing else is signed: the reconciliation fields (Reconciled, Spent,
// Unknown, Reminted) are the central ledger's record, not the gateway's
// grant.
func ShardCanonical(s *Shard) []byte {
	n := 8 + 16 + 2*8*4 // rough: lengths and integers
	for _, str := range []string{SchemaShard, s.ID, s.Account.Subject, s.Account.Route, s.Account.Region, s.GatewayID, s.KeyID} {
		n += 4 + len(str)
	}
	out := make([]byte, 0, n+8*MaxDimensions+5*8)
	out = appendString(out, SchemaShard)
	out = appendString(out, s.ID)
	out = appendString(out, s.Account.Subject)
	out = appendString(out, s.Account.Route)
	out = appendString(out, s.Account.Region)
	out = binary.BigEndian.AppendUint64(out, s.Account.Generation)
	out = appendString(out, s.GatewayID)
	out = binary.BigEndian.AppendUint64(out, s.BootEpoch)
	out = binary.BigEndian.AppendUint64(out, s.Fence)
	for _, u := range s.Allocated {
		out = binary.BigEndian.AppendUint64(out, uint64(u))
	}
	out = binary.BigEndian.AppendUint64(out, uint64(s.IssuedAt.UnixNano()))
	out = binary.BigEndian.AppendUint64(out, uint64(s.ExpiresAt.UnixNano()))
	out = appendString(out, s.KeyID)
	return out
}

func appendString(out []byte, s string) []byte {
	out = binary.BigEndian.AppendUint32(out, uint32(len(s)))
	return append(out, s...)
}

// EncodeShardToken returns the token a gateway receives and keeps: the
// canonical encoding followed by the signature as a length-prefixed byte
// string (4-byte big-endian length). It is what DecodeShardToken reads.
func EncodeShardToken(s *Shard) []byte {
	out := ShardCanonical(s)
	out = binary.BigEndian.AppendUint32(out, uint32(len(s.Signature)))
	return append(out, s.Signature...)
}

// DecodeShardToken parses a token written by EncodeShardToken. It checks
// the shape only (schema, lengths, UTF-8, no trailing bytes, amounts in
// [0, MaxUnits]); VerifyShard checks the signature and the binding.
//
// Returns the shard, or an error wrapping ErrShardMalformed. A decoded
// shard re-encodes to exactly the same bytes.
func DecodeShardToken(token []byte) (*Shard, error) {
	if len(token) > MaxShardToken {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrShardMalformed, len(token), MaxShardToken)
	}
	r := tokenReader{buf: token}
	if schema := r.string("schema"); r.err == nil && schema != SchemaShard {
		return nil, fmt.Errorf("%w: schema %q, want %q", ErrShardMalformed, schema, SchemaShard)
	}
	s := &Shard{}
	s.ID = r.string("shard id")
	s.Account.Subject = r.string("subject")
	s.Account.Route = r.string("route")
	s.Account.Region = r.string("region")
	s.Account.Generation = r.uint64("generation")
	s.GatewayID = r.string("gateway id")
	s.BootEpoch = r.uint64("boot epoch")
	s.Fence = r.uint64("fence")
	for d := range s.Allocated {
		u := int64(r.uint64("allocated"))
		if r.err == nil && (u < 0 || u > MaxUnits) {
			r.err = fmt.Errorf("%w: allocated[%d] = %d is outside [0, %d]", ErrShardMalformed, d, u, MaxUnits)
		}
		s.Allocated[d] = u
	}
	s.IssuedAt = time.Unix(0, int64(r.uint64("issued at"))).UTC()
	s.ExpiresAt = time.Unix(0, int64(r.uint64("expires at"))).UTC()
	s.KeyID = r.string("key id")
	sig := r.bytes("signature", ed25519.SignatureSize*4)
	if r.err == nil && len(r.buf) != 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrShardMalformed, len(r.buf))
	}
	if r.err != nil {
		return nil, r.err
	}
	s.Signature = append([]byte(nil), sig...)
	return s, nil
}

type tokenReader struct {
	buf []byte
	err error
}

func (r *tokenReader) uint64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.buf) < 8 {
		r.err = fmt.Errorf("%w: truncated at %s", ErrShardMalformed, what)
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf)
	r.buf = r.buf[8:]
	return v
}

func (r *tokenReader) bytes(what string, limit int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.buf) < 4 {
		r.err = fmt.Errorf("%w: truncated at %s", ErrShardMalformed, what)
		return nil
	}
	n := binary.BigEndian.Uint32(r.buf)
	if int64(n) > int64(limit) || int64(n) > int64(len(r.buf)-4) {
		r.err = fmt.Errorf("%w: %s of %d bytes (at most %d, %d left)", ErrShardMalformed, what, n, limit, len(r.buf)-4)
		return nil
	}
	v := r.buf[4 : 4+n]
	r.buf = r.buf[4+n:]
	return v
}

func (r *tokenReader) string(what string) string {
	v := r.bytes(what, MaxShardString)
	if r.err == nil && !utf8.Valid(v) {
		r.err = fmt.Errorf("%w: %s is not UTF-8", ErrShardMalformed, what)
	}
	return string(v)
}

// ShardKeys finds the public key of a key id. A ShardKeyRing is one; a
// server's key ring with private keys implements it too.
type ShardKeys interface {
	ShardPublicKey(keyID string) (ed25519.PublicKey, bool)
}

// ShardKeyRing maps key ids to Ed25519 public keys. Rotation adds a key id;
// an old one stays valid for verification until it is removed.
type ShardKeyRing map[string]ed25519.PublicKey

// ShardPublicKey returns the key of keyID, if the ring holds it.
func (r ShardKeyRing) ShardPublicKey(keyID string) (ed25519.PublicKey, bool) {
	k, ok := r[keyID]
	return k, ok && len(k) == ed25519.PublicKeySize
}

// ShardHolder is the process that means to spend a shard: its gateway
// identity, boot epoch, and the newest fence it already holds for the
// shard's subject, route and region (0 when none).
type ShardHolder struct {
	GatewayID   string
	BootEpoch   uint64
	NewestFence uint64
}

// VerifyShard decides whether holder may spend s at time now. It is the
// check gateways run before installing a shard (and again after reading
// one back from disk), and the one the ledger's tools run on stored shards.
//
// Returns nil when the signature verifies under the named key, the shard
// is the holder's (gateway and boot epoch), unexpired, and its fence is not
// older than the holder's newest; otherwise, checked in this order:
// ErrShardUnknownKey, ErrShardSignature, ErrShardForeign (another gateway),
// ErrShardBootEpoch, ErrShardFenced, ErrShardExpired (now >= ExpiresAt).
func VerifyShard(s *Shard, keys ShardKeys, holder ShardHolder, now time.Time) error {
	if err := VerifyShardSignature(s, keys); err != nil {
		return err
	}
	switch {
	case s.GatewayID != holder.GatewayID:
		return fmt.Errorf("%w: shard %s is gateway %q's, not %q's", ErrShardForeign, s.ID, s.GatewayID, holder.GatewayID)
	case s.BootEpoch != holder.BootEpoch:
		return fmt.Errorf("%w: shard %s is boot %d's, this process is boot %d", ErrShardBootEpoch, s.ID, s.BootEpoch, holder.BootEpoch)
	case s.Fence < holder.NewestFence:
		return fmt.Errorf("%w: shard %s has fence %d, the gateway holds fence %d", ErrShardFenced, s.ID, s.Fence, holder.NewestFence)
	case !now.Before(s.ExpiresAt):
		return fmt.Errorf("%w: shard %s expired at %s", ErrShardExpired, s.ID, s.ExpiresAt.Format(time.RFC3339Nano))
	}
	return nil
}

// VerifyShardSignature checks only the signature: nil when s's signed
// fields carry a valid Ed25519 signature by the key it names;
// ErrShardUnknownKey or ErrShardSignature otherwise.
func VerifyShardSignature(s *Shard, keys ShardKeys) error {
	if keys == nil {
		return fmt.Errorf("%w: no keys to verify %s with", ErrShardUnknownKey, s.KeyID)
	}
	key, ok := keys.ShardPublicKey(s.KeyID)
	if !ok {
		return fmt.Errorf("%w: key id %q", ErrShardUnknownKey, s.KeyID)
	}
	if len(s.Signature) != ed25519.SignatureSize || !ed25519.Verify(key, ShardCanonical(s), s.Signature) {
		return fmt.Errorf("%w: shard %s, key %s", ErrShardSignature, s.ID, s.KeyID)
	}
	return nil
}

// Ed25519ShardSigner returns the Sign function of ShardArgs for a private
// key. Ed25519 signatures are deterministic, as ShardArgs requires.
func Ed25519ShardSigner(key ed25519.PrivateKey) func(canonical []byte) []byte {
	return func(canonical []byte) []byte { return ed25519.Sign(key, canonical) }
}
