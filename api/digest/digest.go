// Package digest computes capledger's canonical request digest, the value a
// reservation's request_digest holds. It is shared by the Go SDK (package
// client), which sends it, and by the server, which derives it for a
// Reserve that carries none, so both produce the same digest for the same
// request. It is standard library only and has no state.
//
// The encoding is specified for clients in other languages in
// docs/CLIENTS.md ("The request digest"), with a worked example that the
// tests of this package and of package client pin.
package digest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
)

// Scheme names the canonical encoding; it is the encoding's first field,
// so a future scheme can never produce the digest of this one.
const Scheme = "capledger.requestDigest.v1"

// DefaultRegion is the region the ledger uses when a request names none.
const DefaultRegion = "global"

// Input is what a request digest covers: everything that decides what a
// reservation holds, plus the estimator's identity and a hash of the
// caller's request body, so that two different requests with the same
// estimate are still told apart when the caller supplies them.
type Input struct {
	Subject string
	Route   string
	// Region; empty means DefaultRegion (both spellings give one digest).
	Region string
	// Units is the estimate by unit name. Zero amounts are left out of the
	// encoding, because the ledger treats an omitted unit as 0.
	Units map[string]int64
	// EstimatorDigest identifies the estimator that produced Units; empty
	// when there is none (the server's derived digest leaves it empty).
	EstimatorDigest string
	// BodyHash is the caller's hash of its own request (any string, e.g.
	// "sha256:<hex of the body>"); empty when there is none.
	BodyHash string
}

// ErrInvalidInput is wrapped by every error Request returns.
var ErrInvalidInput = errors.New("invalid request digest input")

// Request returns the canonical request digest of in, "sha256:" followed
// by 64 lowercase hex digits. It returns an error wrapping ErrInvalidInput
// when Subject or Route is empty or an amount is negative, and never
// otherwise.
//
// The canonical encoding is the concatenation of
//
//	str(Scheme) str(subject) str(route) str(region)
//	u32(number of non-zero units)
//	for each non-zero unit, by ascending byte order of its name:
//	    str(name) i64(amount)
//	str(estimatorDigest) str(bodyHash)
//
// where str(s) is u32(len(s)) followed by the bytes of s, u32 is a 4-byte
// big-endian unsigned integer and i64 an 8-byte big-endian two's complement
// integer. Length prefixes make the encoding unambiguous: no two different
// inputs encode to the same bytes, whatever characters they contain.
func Request(in Input) (string, error) {
	if in.Subject == "" || in.Route == "" {
		return "", fmt.Errorf("request digest: %w: subject and route are required", ErrInvalidInput)
	}
	region := in.Region
	if region == "" {
		region = DefaultRegion
	}
	names := make([]string, 0, len(in.Units))
	for name, amount := range in.Units {
		if amount < 0 {
			return "", fmt.Errorf("request digest: %w: unit %q has negative amount %d", ErrInvalidInput, name, amount)
		}
		if amount != 0 {
			names = append(names, name)
		}
	}
	// sort.Strings orders by bytes, as the specification says (not by
	// Unicode collation), so every language can reproduce it.
	sort.Strings(names)

	h := sha256.New()
	var buf [8]byte
	str := func(s string) {
		binary.BigEndian.PutUint32(buf[:4], uint32(len(s)))
		h.Write(buf[:4])
		h.Write([]byte(s))
	}
	str(Scheme)
	str(in.Subject)
	str(in.Route)
	str(region)
	binary.BigEndian.PutUint32(buf[:4], uint32(len(names)))
	h.Write(buf[:4])
	for _, name := range names {
		str(name)
		binary.BigEndian.PutUint64(buf[:], uint64(in.Units[name]))
		h.Write(buf[:])
	}
	str(in.EstimatorDigest)
	str(in.BodyHash)
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// BodyHash returns "sha256:" + the hex SHA-256 of body, the conventional
// Input.BodyHash of an HTTP request body.
func BodyHash(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}
