// Package testbinary builds the Go commands a package's tests run as child
// processes: once per test binary, on first use, with one go build, into a
// temporary directory the package's TestMain removes (Remove). Linking a
// command takes seconds; a package whose tests each built their own spent
// minutes doing so.
package testbinary

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Set is the commands one package's tests run, named by their package
// paths relative to the test's directory (".", "../cmd/capledger").
type Set struct {
	pkgs []string
	once sync.Once
	dir  string
	err  error
}

// New returns the set of the commands in pkgs, built when a test first
// asks for one (Path).
func New(pkgs ...string) *Set { return &Set{pkgs: pkgs} }

// Path returns the path of the command named name (its directory's base
// name, as go build names it), building the whole set first if no test
// did yet; a failed build fails t, and every later caller, with go
// build's output.
func (s *Set) Path(t testing.TB, name string) string {
	t.Helper()
	s.once.Do(func() {
		s.dir, s.err = os.MkdirTemp("", "capledger-test-bin-")
		if s.err != nil {
			return
		}
		args := append([]string{"build", "-o", s.dir + string(filepath.Separator)}, s.pkgs...)
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			s.err = fmt.Errorf("go %v: %v\n%s", args, err, out)
		}
	})
	if s.err != nil {
		t.Fatal(s.err)
	}
	return filepath.Join(s.dir, name)
}

// Remove deletes the built commands; a package's TestMain calls it after
// m.Run.
func (s *Set) Remove() {
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}
