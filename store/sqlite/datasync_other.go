//go:build !linux

package sqlite

import "os"

// datasync flushes f (fsync(2) where fdatasync is not available).
func datasync(f *os.File) error { return f.Sync() }
