package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// missingKeyLines names the backup's key ids the kept keys file lacks,
// and none where either file cannot be read as serve reads it: restore's
// warning is about keys, not about a file serve would refuse anyway.
func TestMissingKeyLinesOfUnreadableFiles(t *testing.T) {
	dir := t.TempDir()
	backup, kept, garbage := filepath.Join(dir, "backup-keys"), filepath.Join(dir, "kept-keys"), filepath.Join(dir, "garbage")
	writeKeyLine(t, backup, "k-old")
	writeKeyLine(t, kept, "k-other")
	if err := os.WriteFile(garbage, []byte("not a key line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := missingKeyLines(backup, kept); !slices.Equal(got, []string{"k-old"}) {
		t.Fatalf("missing %v, want [k-old]", got)
	}
	for _, pair := range [][2]string{{backup, garbage}, {garbage, kept}, {backup, filepath.Join(dir, "none")}} {
		if got := missingKeyLines(pair[0], pair[1]); len(got) != 0 {
			t.Fatalf("missing %v of %s kept as %s, want none (a file that cannot be read)", got, pair[0], pair[1])
		}
	}
}
