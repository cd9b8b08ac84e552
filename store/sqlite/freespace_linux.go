package sqlite

import "syscall"

// freeBytes returns the bytes an unprivileged process may still write on
// the file system holding dir (statfs(2)), and whether it could tell.
func freeBytes(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return st.Bavail * uint64(st.Bsize), true
}
