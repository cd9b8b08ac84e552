package store_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/capledger/capledger/store"
)

// PrefixEnd is the least valid text above every string with the prefix:
// every such string sorts below it as bytes, the prefix itself does not
// reach it, and it is valid UTF-8 for PostgreSQL to accept.
func TestPrefixEnd(t *testing.T) {
	for _, c := range []struct{ prefix, end string }{
		{"shard_unknown/sh-1/", "shard_unknown/sh-10"},
		{"a", "b"},
		{"tenant-é", "tenant-ê"},
		{"x\u007f", "x\u0080"},
		{"x\ud7ff", "x\ue000"},
		{"x\ufffd", "x\ufffe"}, // U+FFFD is a character, not a byte that is not UTF-8
		{"x\U0010ffff", "y"},
		{"x\U0010ffff\U0010ffff", "y"},
		{"", ""},
		{"\U0010ffff", ""},
		{"bad\xff", ""},
	} {
		end := store.PrefixEnd(c.prefix)
		if end != c.end {
			t.Errorf("PrefixEnd(%q) = %q, want %q", c.prefix, end, c.end)
			continue
		}
		if end == "" {
			continue
		}
		if !utf8.ValidString(end) {
			t.Errorf("PrefixEnd(%q) = %q: not valid UTF-8", c.prefix, end)
		}
		for _, s := range []string{c.prefix, c.prefix + "\x00", c.prefix + "\U0010ffff\U0010ffff", c.prefix + "zzz/tokens"} {
			if !(strings.Compare(c.prefix, s) <= 0 && strings.Compare(s, end) < 0) {
				t.Errorf("%q with prefix %q is outside [%q, %q)", s, c.prefix, c.prefix, end)
			}
		}
	}
}
