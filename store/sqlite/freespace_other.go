//go:build !linux

package sqlite

// freeBytes cannot tell the free space here: Open reports a full disk as
// SQLite's I/O error alone.
func freeBytes(string) (uint64, bool) { return 0, false }
