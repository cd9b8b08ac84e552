package yamlfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Int64 is an int64 that a file may give as a number (1000) or as a
// quoted decimal string ("1000"): the API's JSON (protojson) writes int64
// and uint64 fields as strings, so a value copied from it reads. It
// writes itself as a number.
type Int64 int64

// Uint64 is Int64's unsigned kin (the API's generations).
type Uint64 uint64

func (n *Int64) UnmarshalJSON(raw []byte) error {
	text, err := integerText(raw)
	if err != nil || text == "" {
		return err
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return integerError(raw, err, fmt.Sprintf("%d to %d", math.MinInt64, math.MaxInt64), false)
	}
	*n = Int64(v)
	return nil
}

func (n *Uint64) UnmarshalJSON(raw []byte) error {
	text, err := integerText(raw)
	if err != nil || text == "" {
		return err
	}
	v, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return integerError(raw, err, fmt.Sprintf("0 to %d", uint64(math.MaxUint64)), true)
	}
	*n = Uint64(v)
	return nil
}

// integerText returns the digits of raw, a JSON number or string; "" for
// null, which leaves the value as it is (as for any other type).
func integerText(raw []byte) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case string(raw) == "null":
		return "", nil
	case len(raw) > 0 && raw[0] == '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", err
		}
		if text == "" {
			return "", fmt.Errorf(`"" is not an integer`)
		}
		return text, nil
	case len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'):
		return string(raw), nil
	}
	return "", fmt.Errorf("%s is not an integer", raw)
}

// integerError says why raw, whose digits strconv refused with err, is
// not an integer of the range span. The span is said for a number out of
// it, and for any other refusal only where it tells what is wrong
// (unsigned: a minus sign); for "10x" it would only be noise, since the
// field's own range (a burst's, say) is narrower and checked later.
func integerError(raw []byte, err error, span string, unsigned bool) error {
	if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
		return fmt.Errorf("%s is out of range: want %s", raw, span)
	}
	if unsigned {
		return fmt.Errorf("%s is not an integer (want %s)", raw, span)
	}
	return fmt.Errorf("%s is not an integer", raw)
}
