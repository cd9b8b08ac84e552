package main

import (
	"strings"
	"testing"
)

// Retention flags that would lose a retry's answer are refused before
// anything listens or opens.
func TestServeRefusesBadRetentionFlags(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--retention", "2h", "--tombstone-retention", "1h"},
		{"--retention", "-1s"},
		{"--retention-interval", "0s"},
	} {
		code, out, errOut := cli(t, "", append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir}, args...)...)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "retention") {
			t.Fatalf("%v: %q does not say what is wrong", args, errOut)
		}
	}
}
