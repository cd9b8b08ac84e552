package ledger

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxIDBytes bounds the ids a client names: reservation, operation,
// shard, gateway and budget ids.
const MaxIDBytes = 256

// IDProblem says what is wrong with an id a client names, as a phrase
// that follows the field's name ("is required", "is 300 bytes long; at
// most 256", "contains a NUL byte": TextProblem with at most
// MaxIDBytes), or "" for a good id. It is the one rule for ids: the server
// refuses such ids at its door (and in ReconcileShard's receipts), and
// ShardLocal.Reserve refuses them as reservation ids, because their
// receipts would make the shard's whole reconciliation refused.
func IDProblem(id string) string {
	if id == "" {
		return "is required"
	}
	return TextProblem(id, MaxIDBytes)
}

// TextProblem is the one rule for the text a client names things with
// (ids, subjects, routes, regions, rollout names): it says what is wrong
// with value as a phrase that follows the field's name ("contains a NUL
// byte", which the PostgreSQL store cannot keep; "is not valid UTF-8",
// which no protobuf string may be and PostgreSQL refuses; "is 513 bytes
// long; at most 512" past max bytes, max 0 meaning no bound), or "" for
// good text. Empty text is good: whether a field is required is the
// caller's rule. IDProblem, KeyPartProblem, the ledger's account key
// checks and RolloutNameProblem are this rule with their bounds.
func TextProblem(value string, max int) string {
	switch {
	case strings.IndexByte(value, 0) >= 0:
		return "contains a NUL byte"
	case max > 0 && len(value) > max:
		return fmt.Sprintf("is %d bytes long; at most %d", len(value), max)
	case !utf8.ValidString(value):
		return "is not valid UTF-8"
	}
	return ""
}

// NameProblem is the one rule for a name an operator makes up for a thing
// capledger keeps by it (a new rollout, a shard signing key's id): 1 to
// max bytes of ASCII letters, digits, '.', '_' and '-', so that it is one
// word on a command line, in a text table, a log line or a keys file. It
// says what is wrong as a phrase that follows the field's name ("is
// empty", "holds ' ' at byte 3: use only ASCII letters, digits, '.', '_' and
// '-'"), or "" for a good name. Names clients send with requests
// (subjects, routes, ids) are any text (TextProblem).
func NameProblem(name string, max int) string {
	switch {
	case name == "":
		return "is empty"
	case len(name) > max:
		return fmt.Sprintf("is %d bytes long; at most %d", len(name), max)
	}
	for i, r := range name {
		if !nameRune(r) {
			return fmt.Sprintf("holds %q at byte %d: use only ASCII letters, digits, '.', '_' and '-'", r, i)
		}
	}
	return ""
}

// nameRune reports whether r may appear in a name (NameProblem).
func nameRune(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-'
}
