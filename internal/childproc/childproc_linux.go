package childproc

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the kernel send cmd's process SIGKILL when the
// process that started it ends, however it ends. Call it before
// cmd.Start. (Strictly: when the OS thread that forked it ends; Go ends a
// thread only under a goroutine that locked it and exits locked, which the
// tests that use this do not do.)
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
