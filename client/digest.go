package client

import "github.com/capledger/capledger/api/digest"

// DigestScheme names the canonical encoding hashed by RequestDigest; it is
// the first field of the encoding, so a future scheme can never produce the
// digest of this one.
const DigestScheme = digest.Scheme

// DefaultRegion is the region the ledger uses when a request names none.
const DefaultRegion = digest.DefaultRegion

// Units are capacity amounts by unit name, e.g. {"tokens": 600, "requests": 1}.
// A unit the map omits counts as 0.
type Units map[string]int64

// DigestInput is what a request digest covers: everything that decides what
// a reservation holds, plus a hash of the caller's request body so that two
// different requests with the same estimate are still told apart.
type DigestInput struct {
	Subject string
	Route   string
	// Region; empty means DefaultRegion (both spellings give one digest).
	Region string
	// Units is the estimate. Zero amounts are left out of the encoding,
	// because the ledger treats an omitted unit as 0.
	Units Units
	// EstimatorDigest identifies the estimator that produced Units.
	EstimatorDigest string
	// BodyHash is the caller's hash of its own request (any string, e.g.
	// "sha256:<hex of the body>"); empty when there is none.
	BodyHash string
}

// RequestDigest returns the canonical request digest, "sha256:" followed by
// 64 lowercase hex digits, or an error when Subject or Route is empty or an
// amount is negative.
//
// It is package api/digest's Request, which the server also uses for a
// Reserve that carries no digest: with EstimatorDigest and BodyHash empty,
// the SDK and the server derive the same digest for the same request. The
// canonical encoding, which docs/CLIENTS.md repeats for clients in other
// languages, is the concatenation of
//
//	str(DigestScheme) str(subject) str(route) str(region)
//	u32(number of non-zero units)
//	for each non-zero unit, by ascending byte order of its name:
//	    str(name) i64(amount)
//	str(estimatorDigest) str(bodyHash)
//
// where str(s) is u32(len(s)) followed by the bytes of s, u32 is a 4-byte
// big-endian unsigned integer and i64 an 8-byte big-endian two's complement
// integer. Length prefixes make the encoding unambiguous: no two different
// inputs encode to the same bytes, whatever characters they contain.
func RequestDigest(in DigestInput) (string, error) {
	return digest.Request(digest.Input{
		Subject:         in.Subject,
		Route:           in.Route,
		Region:          in.Region,
		Units:           in.Units,
		EstimatorDigest: in.EstimatorDigest,
		BodyHash:        in.BodyHash,
	})
}

// BodyHash returns "sha256:" + the hex SHA-256 of body, the conventional
// DigestInput.BodyHash of an HTTP request body.
func BodyHash(body []byte) string { return digest.BodyHash(body) }
