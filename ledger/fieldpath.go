package ledger

import (
	"strconv"
	"strings"
)

// FieldError is a refused input that names the field it refuses by its
// path as a request's JSON spells it (lowerCamelCase, "[i]" for an item of
// a repeated field), relative to the value that was checked: a Policy's
// "holdTtl" or "dimensions[0].burst". The server roots the path in its
// request (Under("policy"): "policy.holdTtl"), so every message names a
// path the client's JSON has, whichever layer decided it (API.md,
// "Errors"). errors.Is finds Kind (ErrInvalidPolicy, ErrInvalidRollout,
// ErrInvalidCommand) under it.
type FieldError struct {
	Kind    error
	Path    string // "" for the checked value itself ("is required")
	Problem string // what is wrong, as a phrase after the path
	// Also is the path of a second field the problem names, "" for none:
	// the first of a pair that appears twice ("dimensions[0]"). It is a
	// path of the same request, so Under roots it as it roots Path.
	Also string
}

// NewFieldError is the one constructor of a FieldError: kind refusing the
// field at path, problem the phrase that follows the path.
func NewFieldError(kind error, path, problem string) *FieldError {
	return &FieldError{Kind: kind, Path: path, Problem: problem}
}

// Twice returns e naming also, the path of the field that e's field
// repeats: its text ends " (also <also>)".
func (e *FieldError) Twice(also string) *FieldError {
	return &FieldError{Kind: e.Kind, Path: e.Path, Problem: e.Problem, Also: also}
}

// Text is the message without Kind: the path, then the problem ("holdTtl
// 0.050s is shorter than ...", "dimensions: none given ..."), then the
// second path if any ("... appears twice (also dimensions[0])").
func (e *FieldError) Text() string {
	text := e.Path + " " + e.Problem
	switch {
	case e.Path == "":
		text = e.Problem
	case strings.HasPrefix(e.Problem, ":"):
		text = e.Path + e.Problem
	}
	if e.Also != "" {
		text += " (also " + e.Also + ")"
	}
	return text
}

func (e *FieldError) Error() string { return e.Kind.Error() + ": " + e.Text() }
func (e *FieldError) Unwrap() error { return e.Kind }

// Under returns e with its path rooted in parent, the field that held the
// checked value ("policy", "receipts[2]").
func (e *FieldError) Under(parent string) *FieldError {
	under := &FieldError{Kind: e.Kind, Path: FieldPath(parent, e.Path), Problem: e.Problem}
	if e.Also != "" {
		under.Also = FieldPath(parent, e.Also)
	}
	return under
}

// FieldPath is the one rule for field paths: child's path within parent,
// joined by "." ("policy" and "holdTtl": "policy.holdTtl"), an index
// ("[0]") joined bare; either may be empty.
func FieldPath(parent, child string) string {
	switch {
	case parent == "":
		return child
	case child == "":
		return parent
	case strings.HasPrefix(child, "["):
		return parent + child
	}
	return parent + "." + child
}

// ItemPath is the path of item i of the repeated field at path
// ("dimensions", 0: "dimensions[0]").
func ItemPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}
