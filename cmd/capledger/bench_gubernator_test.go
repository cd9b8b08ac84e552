package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/replicatest"
)

// gubernatorBinary returns a gubernator found on PATH or in
// $(go env GOPATH)/bin; the test is skipped without one (scripts/compare.sh
// installs v2.13.0 with go install).
func gubernatorBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("gubernator"); err == nil {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		home, _ := os.UserHomeDir()
		gopath = filepath.Join(home, "go")
	}
	p := filepath.Join(gopath, "bin", "gubernator")
	if _, err := os.Stat(p); err != nil {
		t.Skip("gubernator not installed (go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@v2.13.0)")
	}
	return p
}

// TestBenchGubernatorGRPC drives a real gubernator's gRPC API with the
// hand-encoded GetRateLimits of --mode gubernator --protocol grpc: every
// call admitted while the limit lasts, and an exhausted limit (hits above
// the limit) reported, which a request whose fields were misnumbered
// would not produce.
func TestBenchGubernatorGRPC(t *testing.T) {
	bin := gubernatorBinary(t)
	grpcAddr, httpAddr := replicatest.FreeAddr(t), replicatest.FreeAddr(t)
	cmd := exec.Command(bin)
	childproc.DieWithParent(cmd)
	cmd.Env = append(os.Environ(), "GUBER_GRPC_ADDRESS="+grpcAddr, "GUBER_HTTP_ADDRESS="+httpAddr, "GUBER_LOG_LEVEL=error")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; {
		if c, err := net.Dial("tcp", grpcAddr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("gubernator did not listen")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Gubernator adds itself to its peer pool shortly after it listens;
	// until then it answers "pool is empty".
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := http.Get("http://" + httpAddr + "/v1/HealthCheck")
		if err == nil {
			var health struct {
				Status    string `json:"status"`
				PeerCount int    `json:"peer_count"`
			}
			json.NewDecoder(resp.Body).Decode(&health)
			resp.Body.Close()
			if health.Status == "healthy" && health.PeerCount > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gubernator not healthy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	common := []string{"bench", "--mode", "gubernator", "--protocol", "grpc", "--concurrency", "2", "--duration", "300ms", "--warmup", "0s", "--progress=false"}
	code, out, errOut := cli(t, grpcAddr, common...)
	wantExit(t, exitOK, code, out, errOut)
	if ops, _ := strconv.Atoi(benchRow(t, out, "ops")); ops == 0 || benchRow(t, out, "errors") != "0" {
		t.Fatalf("gubernator gRPC baseline:\n%s", out)
	}
	// More hits per call than the limit (1<<50): gubernator answers
	// OVER_LIMIT, which bench must count as an error.
	code, out, errOut = cli(t, grpcAddr, append(common, "--units", strconv.FormatInt(1<<51, 10))...)
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(out, "overLimit:true") {
		t.Fatalf("an OVER_LIMIT answer was not reported:\n%s", out)
	}
}

// TestGubernatorWireFormat checks the request's field numbers against
// gubernator.proto (v2.13.0: RateLimitReq name 1, unique_key 2, hits 3,
// limit 4, duration 5 inside GetRateLimitsReq.requests 1) and that the
// response parser reads status 1 and error 5 and skips the rest.
func TestGubernatorWireFormat(t *testing.T) {
	req := appendGubernatorRequest(nil, "route", "key", 3, 10, 3600000)
	num, typ, n := protowire.ConsumeTag(req)
	if num != 1 || typ != protowire.BytesType {
		t.Fatalf("outer field %d type %d", num, typ)
	}
	item, _ := protowire.ConsumeBytes(req[n:])
	got := map[protowire.Number]any{}
	for len(item) > 0 {
		num, typ, n := protowire.ConsumeTag(item)
		item = item[n:]
		if typ == protowire.BytesType {
			s, m := protowire.ConsumeString(item)
			got[num], item = s, item[m:]
		} else {
			v, m := protowire.ConsumeVarint(item)
			got[num], item = int64(v), item[m:]
		}
	}
	want := map[protowire.Number]any{1: "route", 2: "key", 3: int64(3), 4: int64(10), 5: int64(3600000)}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("field %d = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}

	var resp []byte
	for _, a := range []struct {
		status uint64
		err    string
	}{{0, ""}, {1, ""}, {0, "boom"}} {
		var r []byte
		r = protowire.AppendTag(r, 1, protowire.VarintType)
		r = protowire.AppendVarint(r, a.status)
		r = protowire.AppendTag(r, 2, protowire.VarintType) // limit, skipped
		r = protowire.AppendVarint(r, 10)
		r = protowire.AppendTag(r, 5, protowire.BytesType)
		r = protowire.AppendString(r, a.err)
		r = protowire.AppendTag(r, 6, protowire.BytesType) // metadata entry, skipped
		r = protowire.AppendBytes(r, []byte{0x0a, 0x01, 'k', 0x12, 0x01, 'v'})
		resp = protowire.AppendTag(resp, 1, protowire.BytesType)
		resp = protowire.AppendBytes(resp, r)
	}
	answers, err := parseGubernatorResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	if len(answers) != 3 || answers[0] != (gubernatorAnswer{}) || !answers[1].overLimit || answers[2].err != "boom" {
		t.Fatalf("answers %+v", answers)
	}
	if _, err := parseGubernatorResponse([]byte{0x0a, 0x05, 0x08}); err == nil {
		t.Fatal("a truncated response parsed")
	}
}
