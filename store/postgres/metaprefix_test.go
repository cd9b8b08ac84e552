package postgres

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/capledger/capledger/ledger"
)

// metaPrefixEnd is the least valid text above every name with the
// prefix: every such name sorts below it as bytes, the prefix itself
// does not reach it, and it is valid UTF-8 for PostgreSQL to accept.
func TestMetaPrefixEnd(t *testing.T) {
	for _, c := range []struct {
		prefix, end string
		ok          bool
	}{
		{"shard_unknown/sh-1/", "shard_unknown/sh-10", true},
		{"a", "b", true},
		{"tenant-é", "tenant-ê", true},
		{"x\u007f", "x\u0080", true},
		{"x\ud7ff", "x\ue000", true},
		{"x\U0010ffff", "y", true},
		{"x\U0010ffff\U0010ffff", "y", true},
		{"", "", false},
		{"\U0010ffff", "", false},
		{"bad\xff", "", false},
	} {
		end, ok := metaPrefixEnd(c.prefix)
		if end != c.end || ok != c.ok {
			t.Errorf("metaPrefixEnd(%q) = %q, %v; want %q, %v", c.prefix, end, ok, c.end, c.ok)
			continue
		}
		if !ok {
			continue
		}
		if !utf8.ValidString(end) {
			t.Errorf("metaPrefixEnd(%q) = %q: not valid UTF-8", c.prefix, end)
		}
		for _, name := range []string{c.prefix, c.prefix + "\x00", c.prefix + "\U0010ffff\U0010ffff", c.prefix + "zzz/tokens"} {
			if !(strings.Compare(c.prefix, name) <= 0 && strings.Compare(name, end) < 0) {
				t.Errorf("%q with prefix %q is outside [%q, %q)", name, c.prefix, c.prefix, end)
			}
		}
	}
	if end, _ := metaPrefixEnd(ledger.MetaShardFencePrefix); end != shardFencePrefixEnd {
		t.Errorf("shardFencePrefixEnd %q, want metaPrefixEnd(%q) = %q", shardFencePrefixEnd, ledger.MetaShardFencePrefix, end)
	}
}
