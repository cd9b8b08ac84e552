package client

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

// docCodes returns the backquoted Connect codes in the part of text that
// starts at from and ends at the first to after it.
func docCodes(t *testing.T, text, from, to string) []string {
	t.Helper()
	start := strings.Index(text, from)
	if start < 0 {
		t.Fatalf("docs/CLIENTS.md no longer says %q", from)
	}
	end := strings.Index(text[start:], to)
	if end < 0 {
		t.Fatalf("docs/CLIENTS.md: no %q after %q", to, from)
	}
	var codes []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(text[start:start+end], -1) {
		codes = append(codes, m[1])
	}
	return codes
}

// TestRetriedCodesAsDocumented: CLIENTS.md section 4 sorts every Connect
// code an answer can carry into lost answers (retried with the same ids)
// and answers (resource_exhausted, rule 5; the decided codes, rule 6), so
// that a client in another language retries exactly what the Go SDK
// retries. The SDK's own classification must agree with the page, and the
// page must leave no code out (an author would have to guess).
func TestRetriedCodesAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/CLIENTS.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	lost := docCodes(t, text, "the case for: a timeout of the call", "(HTTP 502")
	decided := append(docCodes(t, text, "Do not retry the other decided answers (", ")"), "resource_exhausted")
	named := map[string]bool{}
	for _, name := range lost {
		named[name] = true
		code := codeNamed(t, name)
		err := connect.NewError(code, errors.New("from the ledger"))
		if !isTransportFault(err) || !retryable(context.Background(), err) {
			t.Errorf("CLIENTS.md counts %s as a lost answer, the SDK does not retry it", name)
		}
	}
	for _, name := range decided {
		named[name] = true
		code := codeNamed(t, name)
		err := connect.NewError(code, errors.New("from the ledger"))
		if isTransportFault(err) || retryable(context.Background(), err) {
			t.Errorf("CLIENTS.md counts %s as an answer not to retry, the SDK retries it", name)
		}
	}
	for code := connect.Code(1); code <= connect.CodeUnauthenticated; code++ {
		if !named[code.String()] {
			t.Errorf("CLIENTS.md section 4 does not say whether %s is a lost answer or an answer", code)
		}
	}
}

func codeNamed(t *testing.T, name string) connect.Code {
	t.Helper()
	var code connect.Code
	if err := code.UnmarshalText([]byte(name)); err != nil {
		t.Fatalf("CLIENTS.md names %q, not a Connect code: %v", name, err)
	}
	return code
}
