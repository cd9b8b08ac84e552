package codec

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/capledger/capledger/ledger"
)

// rolloutDoc is the stored form of a rollout (written a few times a day,
// so readable JSON). The JSON names are fixed here, independent of the Go
// field names, so renaming a field in package ledger cannot change what is
// on disk.
type rolloutDoc struct {
	Version int               `json:"v"`
	Name    string            `json:"name"`
	By      string            `json:"by"`
	Routes  []rolloutRouteDoc `json:"routes"`
	Share   uint32            `json:"share_bp"`
	Rev     uint64            `json:"version"`
	Steps   []rolloutStepDoc  `json:"steps"`
}

type rolloutRouteDoc struct {
	Route  string `json:"route"`
	Region string `json:"region"`
}

type rolloutStepDoc struct {
	Seq      int    `json:"seq"`
	Action   string `json:"action"`
	Share    uint32 `json:"share_bp"`
	Prior    uint32 `json:"prior_bp"`
	Who      string `json:"who"`
	AtNs     int64  `json:"at_ns"`
	Undoes   int    `json:"undoes,omitempty"`
	UndoneBy int    `json:"undone_by,omitempty"`
}

const rolloutVersion = 1

// EncodeRollout returns the stored form of r, or an error for a string
// that is not valid UTF-8 (JSON would replace its invalid bytes).
func EncodeRollout(r *ledger.Rollout) ([]byte, error) {
	doc := rolloutDoc{Version: rolloutVersion, Name: r.Name, By: string(r.By), Share: uint32(r.Share), Rev: r.Version,
		Routes: make([]rolloutRouteDoc, len(r.Routes)), Steps: make([]rolloutStepDoc, len(r.Steps))}
	strs := []string{r.Name, string(r.By)}
	for i, rk := range r.Routes {
		doc.Routes[i] = rolloutRouteDoc{Route: rk.Route, Region: rk.Region}
		strs = append(strs, rk.Route, rk.Region)
	}
	for i, s := range r.Steps {
		doc.Steps[i] = rolloutStepDoc{Seq: s.Seq, Action: string(s.Action), Share: uint32(s.Share), Prior: uint32(s.Prior),
			Who: s.Who, AtNs: s.At.UnixNano(), Undoes: s.Undoes, UndoneBy: s.UndoneBy}
		strs = append(strs, s.Who)
	}
	for _, s := range strs {
		if !utf8.ValidString(s) {
			return nil, corrupt("rollout", "%q is not valid UTF-8", s)
		}
	}
	return json.Marshal(doc)
}

// DecodeRollout returns the rollout encoded in src, or an error wrapping
// ErrCorrupt for bytes that are not an EncodeRollout value of a version
// this binary knows.
func DecodeRollout(src []byte) (ledger.Rollout, error) {
	var doc rolloutDoc
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return ledger.Rollout{}, corrupt("rollout", "%v", err)
	}
	if dec.More() {
		return ledger.Rollout{}, corrupt("rollout", "trailing data")
	}
	if doc.Version != rolloutVersion {
		return ledger.Rollout{}, corrupt("rollout", "format version %d, this binary reads %d", doc.Version, rolloutVersion)
	}
	r := ledger.Rollout{Name: doc.Name, By: ledger.RolloutHash(doc.By), Share: ledger.BasisPoints(doc.Share), Version: doc.Rev,
		Routes: make([]ledger.RouteKey, len(doc.Routes)), Steps: make([]ledger.RolloutStep, len(doc.Steps))}
	for i, rk := range doc.Routes {
		r.Routes[i] = ledger.RouteKey{Route: rk.Route, Region: rk.Region}
	}
	for i, s := range doc.Steps {
		r.Steps[i] = ledger.RolloutStep{Seq: s.Seq, Action: ledger.RolloutAction(s.Action), Share: ledger.BasisPoints(s.Share),
			Prior: ledger.BasisPoints(s.Prior), Who: s.Who, At: time.Unix(0, s.AtNs).UTC(), Undoes: s.Undoes, UndoneBy: s.UndoneBy}
	}
	return r, nil
}
