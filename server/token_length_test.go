package server_test

import (
	"strings"
	"testing"

	"github.com/capledger/capledger/server"
)

// A token of exactly 16 characters, the documented minimum (README,
// docs/API.md), is accepted; one of 15 is refused naming the line.
// (A planted break refusing the 16-character token passed every other
// test.)
func TestTokensFileAcceptsTheMinimumTokenLength(t *testing.T) {
	sixteen := strings.Repeat("k", 16)
	if _, err := server.ParseTokens(strings.NewReader(sixteen + " gateway gw-1\n")); err != nil {
		t.Errorf("a 16-character token: %v, want accepted", err)
	}
	_, err := server.ParseTokens(strings.NewReader("# tokens\n" + sixteen[:15] + " gateway gw-1\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "shorter than 16") {
		t.Errorf("a 15-character token: %v, want refused on line 2 as shorter than 16 characters", err)
	}
}
