package codec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/capledger/capledger/ledger"
)

// dimensionsDoc is the stored form of a policy's dimensions. The JSON names
// are fixed here, independent of the Go field names, so renaming a field in
// package ledger cannot change what is on disk.
type dimensionsDoc struct {
	Version    int            `json:"v"`
	Dimensions []dimensionDoc `json:"dimensions"`
}

type dimensionDoc struct {
	Unit             string `json:"unit"`
	RefillUnits      int64  `json:"refill_units"`
	RefillIntervalNs int64  `json:"refill_interval_ns"`
	Burst            int64  `json:"burst"`
	MaxReservation   int64  `json:"max_reservation"`
	MaxOverdraft     int64  `json:"max_overdraft"`
}

const dimensionsVersion = 1

// EncodeDimensions returns the JSON encoding of a policy's dimensions
// (written once per published generation, so readability wins over size).
// It returns an error for more than ledger.MaxDimensions dimensions or a
// unit name that is not valid UTF-8.
func EncodeDimensions(dims []ledger.Dimension) ([]byte, error) {
	if len(dims) > ledger.MaxDimensions {
		return nil, fmt.Errorf("encode dimensions: %d dimensions, at most %d", len(dims), ledger.MaxDimensions)
	}
	for _, d := range dims {
		// JSON would silently replace invalid bytes with U+FFFD.
		if !utf8.ValidString(d.Unit) {
			return nil, fmt.Errorf("encode dimensions: unit %q is not valid UTF-8", d.Unit)
		}
	}
	doc := dimensionsDoc{Version: dimensionsVersion, Dimensions: make([]dimensionDoc, len(dims))}
	for i, d := range dims {
		doc.Dimensions[i] = dimensionDoc{
			Unit: d.Unit, RefillUnits: d.RefillUnits, RefillIntervalNs: int64(d.RefillInterval),
			Burst: d.Burst, MaxReservation: d.MaxReservation, MaxOverdraft: d.MaxOverdraft,
		}
	}
	return json.Marshal(doc)
}

// DecodeDimensions returns the dimensions encoded in src (nil for none), or
// an error wrapping ErrCorrupt for bytes that are not an EncodeDimensions
// value of a version this binary knows.
func DecodeDimensions(src []byte) ([]ledger.Dimension, error) {
	var doc dimensionsDoc
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, corrupt("dimensions", "%v", err)
	}
	if dec.More() {
		return nil, corrupt("dimensions", "trailing data")
	}
	if doc.Version != dimensionsVersion {
		return nil, corrupt("dimensions", "format version %d, this binary reads %d", doc.Version, dimensionsVersion)
	}
	if len(doc.Dimensions) > ledger.MaxDimensions {
		return nil, corrupt("dimensions", "%d dimensions, at most %d", len(doc.Dimensions), ledger.MaxDimensions)
	}
	if len(doc.Dimensions) == 0 {
		return nil, nil
	}
	out := make([]ledger.Dimension, len(doc.Dimensions))
	for i, d := range doc.Dimensions {
		out[i] = ledger.Dimension{
			Unit: d.Unit, RefillUnits: d.RefillUnits, RefillInterval: time.Duration(d.RefillIntervalNs),
			Burst: d.Burst, MaxReservation: d.MaxReservation, MaxOverdraft: d.MaxOverdraft,
		}
	}
	return out, nil
}
