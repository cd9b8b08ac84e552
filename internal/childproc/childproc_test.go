//go:build linux

package childproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestChildDiesWithKilledParent starts a parent process (this test binary
// again) that starts a long sleep with DieWithParent and prints its pid;
// killing the parent with SIGKILL, as go test does at its timeout, must
// end the sleep too.
func TestChildDiesWithKilledParent(t *testing.T) {
	parent := exec.Command(os.Args[0], "-test.run=^TestChildDiesWithKilledParentHelper$")
	parent.Env = append(os.Environ(), "CHILDPROC_PARENT=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		parent.Process.Kill()
		t.Fatalf("parent printed no child pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "child ")))
	if err != nil {
		parent.Process.Kill()
		t.Fatalf("parent printed %q", line)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if !alive(pid) {
		t.Fatalf("child %d not running before its parent was killed", pid)
	}
	parent.Process.Kill()
	parent.Wait()
	for deadline := time.Now().Add(10 * time.Second); alive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still running 10 s after its parent was killed", pid)
		}
	}
}

// TestChildDiesWithKilledParentHelper is the parent process of the test
// above; run directly it does nothing.
func TestChildDiesWithKilledParentHelper(t *testing.T) {
	if os.Getenv("CHILDPROC_PARENT") != "1" {
		t.Skip("the parent process of TestChildDiesWithKilledParent")
	}
	child := exec.Command("sleep", "600")
	DieWithParent(child)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("child %d\n", child.Process.Pid)
	time.Sleep(time.Minute)
}

// alive reports whether pid runs: it exists and is not a zombie waiting
// for whoever adopted it to reap it.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
