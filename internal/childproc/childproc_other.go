//go:build !linux

package childproc

import "os/exec"

// DieWithParent does nothing where the kernel has no parent-death signal
// (only Linux has PR_SET_PDEATHSIG): there a killed test binary's children
// must be stopped by hand.
func DieWithParent(cmd *exec.Cmd) {}
