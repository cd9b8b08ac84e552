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

// A maintenance share outside (0, 1] is refused before anything listens
// or opens.
func TestServeRefusesBadMaintenanceShare(t *testing.T) {
	dir := t.TempDir()
	for _, share := range []string{"0", "-0.5", "1.5", "NaN", "many"} {
		code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:0", "--data-dir", dir, "--maintenance-share", share)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "maintenance-share") {
			t.Fatalf("--maintenance-share %s: %q does not say what is wrong", share, errOut)
		}
	}
}
