package main

import (
	"os"
	"testing"

	"github.com/capledger/capledger/internal/testbinary"
)

// The binaries the tests run: capledger and testdata/executor, the job
// executor the resolver tests crash, built once per package run.
var binaries = testbinary.New(".", "./testdata/executor")

func TestMain(m *testing.M) {
	code := m.Run()
	binaries.Remove()
	os.Exit(code)
}

// buildBinaries returns the paths of capledger and testdata/executor.
func buildBinaries(t testing.TB) (capledger, executor string) {
	t.Helper()
	return binaries.Path(t, "capledger"), binaries.Path(t, "executor")
}

// buildBinary returns the capledger binary built for this package run.
func buildBinary(t testing.TB) string {
	t.Helper()
	return binaries.Path(t, "capledger")
}
