package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/testport"
)

// capledger status prints the replica's /statusz: a serve on SQLite owns
// the worker lease, so it reports itself as the worker leader; a server
// that cannot be reached exits 5.
func TestCLIStatus(t *testing.T) {
	url := startInProcess(t, "--lease-ttl", "1s")
	var st struct {
		Ready   bool `json:"ready"`
		Workers struct {
			Leader bool   `json:"leader"`
			Self   string `json:"self"`
			Holder string `json:"holder"`
			Health map[string]struct {
				Failing      *bool      `json:"failing"`
				FailingSince *time.Time `json:"failingSince"`
			} `json:"health"`
		} `json:"workers"`
	}
	for i := 0; ; i++ {
		code, out, errOut := cli(t, url, "status")
		wantExit(t, exitOK, code, out, errOut)
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status output %q: %v", out, err)
		}
		if st.Workers.Leader || i > 300 {
			break
		}
		time.Sleep(10 * time.Millisecond) // the first lease attempt runs on its own goroutine
	}
	if !st.Ready || !st.Workers.Leader || st.Workers.Self == "" || st.Workers.Holder != st.Workers.Self {
		t.Fatalf("status %+v: want ready and this replica the worker leader", st)
	}
	// Each worker serve runs by default, none failing.
	for _, name := range []string{"expiry", "epochs", "retention", "compaction"} {
		if h, ok := st.Workers.Health[name]; !ok || h.Failing == nil || *h.Failing || h.FailingSince != nil {
			t.Fatalf("status workers.health %+v: want %s listed, not failing", st.Workers.Health, name)
		}
	}

	addr := testport.Addr(t) // nothing listens here now
	code, out, errOut := cli(t, "http://"+addr, "status")
	wantExit(t, exitUnavailable, code, out, errOut)

	code, out, errOut = cli(t, url, "serve", "--lease-ttl", "1ms")
	wantExit(t, exitUsage, code, out, errOut)
}

// status --help names the optional blocks of /statusz that API.md lists,
// so an operator who sees them knows they are expected.
func TestStatusHelpNamesTheOptionalBlocks(t *testing.T) {
	code, out, errOut := cli(t, "", "status", "--help")
	wantExit(t, exitOK, code, out, errOut)
	for _, block := range []string{"compaction", "retention", "subjectIndex", "workers.health"} {
		if !strings.Contains(out, block) {
			t.Errorf("status --help does not name /statusz's %s block:\n%s", block, out)
		}
	}
}
