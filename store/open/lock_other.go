//go:build !unix

package open

// lockFile does nothing where flock is not available.
func lockFile(path string) (func(), error) { return func() {}, nil }
