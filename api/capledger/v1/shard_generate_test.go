package capledgerv1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestShardGeneratedCodeIsCurrent is TestGeneratedCodeIsCurrent for
// shard.proto's generated files: regenerate into a temporary directory and
// compare byte for byte. It skips when the generators are not installed.
func TestShardGeneratedCodeIsCurrent(t *testing.T) {
	path := os.Getenv("PATH")
	if home, err := os.UserHomeDir(); err == nil {
		path = path + string(os.PathListSeparator) + filepath.Join(home, "go", "bin")
	}
	t.Setenv("PATH", path)
	for _, tool := range []string{"buf", "protoc-gen-go", "protoc-gen-connect-go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed, so regeneration cannot be checked: %v", tool, err)
		}
	}
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..", "..")
	out := t.TempDir()
	template := "version: v2\nplugins:\n" +
		"  - local: protoc-gen-go\n    out: " + out + "\n    opt: paths=source_relative\n" +
		"  - local: protoc-gen-connect-go\n    out: " + out + "\n    opt: paths=source_relative\n"
	cmd := exec.Command("buf", "generate", "--template", template, "--path", "api/capledger/v1/shard.proto")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BUF_CACHE_DIR="+t.TempDir())
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, output)
	}
	for _, rel := range []string{"capledger/v1/shard.pb.go", "capledger/v1/capledgerv1connect/shard.connect.go"} {
		want, err := os.ReadFile(filepath.Join(out, rel))
		if err != nil {
			t.Fatalf("regenerated %s: %v", rel, err)
		}
		got, err := os.ReadFile(filepath.Join(root, "api", rel))
		if err != nil {
			t.Fatalf("committed %s: %v", rel, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("api/%s differs from what buf generate produces: run `buf generate` and commit the result", rel)
		}
	}
}
