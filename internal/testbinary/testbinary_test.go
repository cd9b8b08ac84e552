package testbinary

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The set builds every command once, on first use: a second Path reuses
// the first build, the binary runs, and Remove deletes it.
func TestBuildsOnceAndRemoves(t *testing.T) {
	s := New("./testdata/hello")
	bin := s.Path(t, "hello")
	first, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := os.Stat(s.Path(t, "hello")); err != nil || !again.ModTime().Equal(first.ModTime()) {
		t.Fatalf("second Path rebuilt or lost the binary: %v %v", again, err)
	}
	out, err := exec.Command(bin).Output()
	if err != nil || strings.TrimSpace(string(out)) != "hello" {
		t.Fatalf("running the built command: %q %v", out, err)
	}
	s.Remove()
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Fatalf("after Remove: %v, want the binary gone", err)
	}
}
