package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The binaries the tests run are built once per package run, on first
// use, into binDir: a go build links for seconds, and most tests of this
// package run the real binary. Tests only execute them, never change them.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinaries compiles capledger and testdata/executor, the job
// executor the resolver tests crash, in one go build, once.
func buildBinaries(t testing.TB) (capledger, executor string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "capledger-cmd-test-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		if out, err := exec.Command("go", "build", "-o", dir+string(filepath.Separator), ".", "./testdata/executor").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "capledger"), filepath.Join(binDir, "executor")
}

// buildBinary returns the capledger binary built for this package run.
func buildBinary(t testing.TB) string {
	t.Helper()
	bin, _ := buildBinaries(t)
	return bin
}
