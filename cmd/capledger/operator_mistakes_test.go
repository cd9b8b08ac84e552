package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/testport"
)

// `capledger policy get 1 --format yaml > tenant-7.yaml` against a server
// that is down (or a wrong --addr) leaves the file empty. Publishing it
// sent an empty policy, refused by the server as one without a subject,
// which sent the operator looking for a subject line. The file is refused
// as empty before anything is sent, and nothing is published.
func TestPolicyPublishOfAnEmptyFileSendsNothing(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	for name, content := range map[string]string{"empty.yaml": "", "comments.yaml": "# tenant-7\n\n"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := cli(t, url, "policy", "publish", path)
		wantExit(t, exitUsage, code, out, errOut)
		if want := "policy " + path + ": the file is empty"; !strings.Contains(errOut, want) || strings.Contains(errOut, "INVALID_POLICY") {
			t.Errorf("publish %s: %q, want %q and no server refusal", name, errOut, want)
		}
	}
	code, out, errOut := cli(t, url, "policy", "list")
	wantExit(t, exitOK, code, out, errOut)
	if strings.Contains(out, "generation") {
		t.Errorf("an empty file published a policy:\n%s", out)
	}
}

// The client commands' --addr is a URL; pasted into serve's it failed as
// "too many colons in address", and a port out of range was called
// reachable from other machines. serve says what it wants, before it
// opens anything.
func TestServeAddrSaysHostPort(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ addr, says string }{
		{"http://127.0.0.1:0", `serve listens on HOST:PORT, without http:// (--addr 127.0.0.1:0)`},
		{"https://127.0.0.1:7070/", `without https:// (--addr 127.0.0.1:7070)`},
		{"127.0.0.1:99999", `want HOST:PORT, such as 127.0.0.1:7070`},
		{"127.0.0.1", `missing port in address`},
	} {
		code, out, errOut := cli(t, "", "serve", "--addr", c.addr, "--data-dir", filepath.Join(dir, "data"))
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, c.says) || strings.Contains(errOut, "reachable from other machines") {
			t.Errorf("serve --addr %s: %q, want %q", c.addr, errOut, c.says)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("a refused --addr created the data directory: %v", err)
	}
}

// A rolled-back generation's capacity whose deciding account is at its
// burst moves only once the subject uses some there: for an idle tenant
// `rollback --wait` followed the same "100 units left" until --max-wait
// without a reason. The progress line says what blocks it.
func TestRollbackWaitSaysWhatIsBlockedByBurst(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	runCLI := func(want int, args ...string) (string, string) {
		t.Helper()
		code, out, errOut := cli(t, url, args...)
		wantExit(t, want, code, out, errOut)
		return out, errOut
	}
	// "*" first (generation 1), then tenant-7's own (2): once 2 is rolled
	// back, 1 decides for tenant-7, and its refill fills tenant-7's
	// account there to its burst while the hold on 2 is out.
	for _, subject := range []string{`"*"`, "tenant-7"} {
		path := filepath.Join(dir, "policy.yaml")
		body := "subject: " + subject + "\nroute: chat.generate\nholdTtl: 1s\ndimensions:\n  - unit: tokens\n    burst: 1000\n" +
			"    refillUnits: 100\n    refillInterval: 100ms\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		runCLI(exitOK, "policy", "publish", path)
	}
	runCLI(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=100", "--id", "hold")
	runCLI(exitOK, "rollback", "2")
	// The hold expires after 1 s; its 100 tokens then cannot move to
	// tenant-7's account under generation 1, full by refill.
	out, errOut := runCLI(exitConflict, "rollback", "--status", "2", "--wait", "--interval", "100ms", "--max-wait", "4s")
	last := errOut[strings.LastIndex(strings.TrimSuffix(errOut, "\n"), "["):]
	if !strings.Contains(last, "100 units left, 0 shards open, ") || !strings.Contains(last, ", 1 account blocked by burst (moves once the deciding account has room)") ||
		!strings.Contains(out, "1 by burst, 0 no policy") {
		t.Errorf("the progress line does not say what blocks the drain:\nstdout: %s\nstderr: %s", out, errOut)
	}
}

// `capledger status` against a server that is down said "capledger
// status: status: Get ...": the command's name twice.
func TestStatusOfADownServerNamesTheCommandOnce(t *testing.T) {
	addr := testport.Addr(t) // nothing listens here now
	code, out, errOut := cli(t, "http://"+addr, "status")
	wantExit(t, exitUnavailable, code, out, errOut)
	if want := `capledger status: Get "http://` + addr + `/statusz": dial tcp`; !strings.HasPrefix(errOut, want) {
		t.Errorf("status of a server that is down: %q, want it to start %q", errOut, want)
	}
}

// A command without a token (or with a wrong one) against a server with
// --tokens was told to "send `Authorization: Bearer <token>`", the API's
// words; the operator at a shell is told the flag.
func TestMissingTokenNamesTheFlag(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("admin-token-0123456789 admin ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startInProcess(t, "--tokens", tokens)
	for _, args := range [][]string{{"policy", "list"}, {"policy", "list", "--token", "not-a-token-of-this-server"}} {
		code, out, errOut := cli(t, url, args...)
		wantExit(t, exitUsage, code, out, errOut)
		if want := "; this server checks tokens: give yours with --token TOKEN or $CAPLEDGER_TOKEN\n"; !strings.HasSuffix(errOut, want) {
			t.Errorf("capledger %v: %q, want it to end %q", args, errOut, want)
		}
	}
	code, out, errOut := cli(t, url, "policy", "list", "--token", "admin-token-0123456789")
	wantExit(t, exitOK, code, out, errOut)
}

// serve started from another directory, or with a mistyped --data-dir,
// made a new, empty ledger without a word: every gateway then met
// NO_POLICY. Its log says when it created the database, and only then.
func TestServeSaysWhenItCreatedTheDatabase(t *testing.T) {
	dataDir := t.TempDir()
	for i, wantCreated := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		logs := &lockedBuffer{}
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, &env{stdout: logs, stderr: logs, getenv: func(string) string { return "" }},
				[]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir})
		}()
		for deadline := time.Now().Add(30 * time.Second); listeningLine.FindString(logs.String()) == ""; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("start %d: serve did not start:\n%s", i, logs.String())
			}
		}
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("start %d: serve exited %d:\n%s", i, code, logs.String())
		}
		want := `msg="no database was there: created a new, empty one" path=` + filepath.Join(dataDir, "capledger.db")
		if got := strings.Contains(logs.String(), want); got != wantCreated {
			t.Errorf("start %d: the log says it created the database: %v, want %v:\n%s", i, got, wantCreated, logs.String())
		}
	}
}

// A policy file written as JSON was read by the YAML decoder, which
// published what JSON refuses: a trailing comma, a comment, a key given
// twice (the last one won). A file that is JSON (a .json name, or "{"
// first, standard input too) is refused for them, naming the line and
// column, before anything is sent; YAML files stay YAML.
func TestPolicyPublishOfMalformedJSONSendsNothing(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	terms := "\"subject\": \"tenant-7\",\n  \"route\": \"chat\",\n  \"dimensions\": [{\"unit\": \"tokens\", \"burst\": 10}"
	for _, c := range []struct{ name, content, says string }{
		{"comma.json", "{\n  " + terms + "],\n}\n", "line 5, column 1: invalid character '}' looking for beginning of object key string (a comma before }: JSON allows no trailing comma)"},
		{"comma-in-list.yaml", "{\n  " + terms + ",]\n}\n", "line 4, column 50: invalid character ']' looking for beginning of value (a comma before ]: JSON allows no trailing comma)"},
		{"comment.json", "{\n  // tenant 7\n  " + terms + "]\n}\n", "line 2, column 3: invalid character '/'"},
		{"twice.json", "{\n  " + terms + "],\n  \"route\": \"embed\"\n}\n", `line 5, column 3: key "route" given twice`},
		{"yaml.json", "subject: tenant-7\nroute: chat\n", "line 1, column 1: invalid character 's' looking for beginning of value"},
	} {
		path := filepath.Join(dir, c.name)
		if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := cli(t, url, "policy", "publish", path)
		wantExit(t, exitUsage, code, out, errOut)
		if want := "policy " + path + ": " + c.says; !strings.Contains(errOut, want) {
			t.Errorf("publish %s: %q, want %q", c.name, errOut, want)
		}
	}
	code, out, errOut := cli(t, url, "policy", "list")
	wantExit(t, exitOK, code, out, errOut)
	if strings.Contains(out, "generation") {
		t.Fatalf("a malformed JSON file published a policy:\n%s", out)
	}
	// The same terms, well formed, publish: as JSON and as YAML.
	for name, content := range map[string]string{
		"ok.json": "{\n  " + terms + "]\n}\n",
		"ok.yaml": "# tenant 7\nsubject: tenant-7\nroute: chat\ndimensions: [{unit: tokens, burst: 10,}]\n",
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := cli(t, url, "policy", "publish", path)
		wantExit(t, exitOK, code, out, errOut)
	}
}
