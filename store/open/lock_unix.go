//go:build unix

package open

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path (created if missing) without
// waiting; the lock ends with unlock or with the process.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("open store: %s %w: another capledger serve (or migrate) uses this store; one process owns a SQLite store", path, ErrStoreLocked)
		}
		return nil, fmt.Errorf("open store: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
