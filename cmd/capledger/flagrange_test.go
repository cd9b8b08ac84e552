package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A flag's value outside what it can mean was taken: --shard-max-ttl
// above the API's longest duration (9223372036s) or below a second,
// --max-body or --cache-rows so large that a limit overflowed
// (--max-batch 1e12 made the engine's queue panic), a busy-looping
// --retention-interval 1ns, an unknown --by that only the server refused,
// --percent 150, --keys or --receipts ignored beside the flag that made
// them meaningless. Each is refused as the flags are parsed (exit 1,
// before anything listens, opens or is sent: the store here is an
// unreachable PostgreSQL, which would be exit 5, and the server a closed
// port), naming the flag, the value given and the range.
func TestFlagsOutOfRangeAreRefusedNamingFlagValueAndRange(t *testing.T) {
	dir := t.TempDir()
	unreachable := []string{"--addr", "127.0.0.1:0", "--store", "postgres://127.0.0.1:1/none", "--data-dir", dir}
	serve := func(flags ...string) []string { return append(append([]string{"serve"}, unreachable...), flags...) }
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("not a token"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{serve("--shard-max-ttl", "2562047h47m16.5s"), "--shard-max-ttl 2562047h47m16.5s: want 1s to 2562047h47m16s (9223372036s, the API's longest duration)"},
		{serve("--shard-max-ttl", "999ms"), "--shard-max-ttl 999ms: want 1s to 2562047h47m16s"},
		{serve("--shard-max-ttl", "0s"), "--shard-max-ttl 0s: want 1s to"},
		{serve("--max-body", "9223372036854775807"), "--max-body 9223372036854775807: want 1024 to 1073741824"},
		{serve("--max-body", "100"), "--max-body 100: want 1024 to 1073741824"},
		{serve("--max-batch", "1000000000000"), "--max-batch 1000000000000: want 1 to 65536"},
		{serve("--max-batch", "0"), "--max-batch 0: want 1 to 65536"},
		{serve("--cache-rows", "36028797018963968"), "--cache-rows 36028797018963968: want 1 to 1073741824"},
		{serve("--cache-rows", "-5"), "--cache-rows -5: want 1 to 1073741824"},
		{serve("--lease-ttl", "100ms"), "--lease-ttl 100ms: want 300ms to 24h0m0s"},
		{serve("--lease-ttl", "48h"), "--lease-ttl 48h0m0s: want 300ms to 24h0m0s"},
		{serve("--store-timeout", "0s"), "--store-timeout 0s: want 1s to 10m0s"},
		{serve("--store-timeout", "1h"), "--store-timeout 1h0m0s: want 1s to 10m0s"},
		{serve("--retention", "-1h"), "--retention -1h0m0s: want 0s to"},
		{serve("--tombstone-retention", "-1s"), "--tombstone-retention -1s: want 0s to"},
		{serve("--retention-interval", "1ns"), "--retention-interval 1ns: want 1ms to 24h0m0s"},
		{serve("--statement-retention", "-1h"), "--statement-retention -1h0m0s: want 0 (keep statements forever) or 24h0m0s to"},
		{serve("--statement-retention", "30m"), "--statement-retention 30m0s: want 0 (keep statements forever) or 24h0m0s to"},
		{serve("--statement-retention", "720h", "--retention", "0"), "--statement-retention 720h0m0s needs the retention pass, which --retention 0 turns off"},
		{serve("--retention-interval", "0s"), "--retention-interval 0s: want 1ms to 24h0m0s"},
		{serve("--compaction-interval", "48h"), "--compaction-interval 48h0m0s: want 1ms to 24h0m0s"},
		{serve("--compaction", "10ms"), "--compaction 10ms: want 0 (keep the whole journal) or 1s to"},
		{serve("--compaction", "-1h"), "--compaction -1h0m0s: want 0 (keep the whole journal) or 1s to"},
		{serve("--maintenance-share", "1.5"), "--maintenance-share 1.5: want a share above 0 and at most 1"},
		{serve("--log-level", "loud"), `--log-level "loud": want debug, info, warn or error`},
		{serve("--tokens", "tokens.json", "--insecure"), "--insecure allows a non-loopback --addr without --tokens, and --tokens FILE turns auth on: give one or the other"},
		{serve("--grpc-transport", "quic"), `--grpc-transport "quic": want grpc-go or net/http`},
		{[]string{"bench", "--concurrency", "0"}, "--concurrency 0: want 1 to 65536"},
		{[]string{"bench", "--concurrency", "10000000"}, "--concurrency 10000000: want 1 to 65536"},
		{[]string{"bench", "--duration", "0s"}, "--duration 0s: want 1ns to"},
		{[]string{"bench", "--warmup", "-1s"}, "--warmup -1s: want 0s to"},
		{[]string{"bench", "--subjects", "0"}, "--subjects 0: want 1 to 1073741824"},
		{[]string{"bench", "--batch-size", "1001"}, "--batch-size 1001: want 1 to 1000"},
		{[]string{"bench", "--units", "9007199254740993"}, "--units 9007199254740993: want 1 to 9007199254740992"},
		{[]string{"bench", "--subjects", "700", "--prefill-from", "701"}, "--prefill-from 701: want 0 to 700"},
		{[]string{"bench", "--subjects", "700", "--prefill=false", "--prefill-from", "5"}, "--prefill-from 5 resumes a prefill, and there is none"},
		{[]string{"bench", "--epoch-length", "500ms"}, "--epoch-length 500ms: want 0 (the server's default) or 1s to 438300h0m0s"},
		{[]string{"bench", "--rate", "-1"}, "--rate -1: want a number of ops a second"},
		{[]string{"bench", "--mode", "fast"}, `--mode "fast": want one of`},
		{[]string{"rollback", "1", "--wait", "--interval", "0s"}, "--interval 0s: want 1ms to 1h0m0s"},
		{[]string{"rollback", "1", "--wait", "--interval", "2h"}, "--interval 2h0m0s: want 1ms to 1h0m0s"},
		{[]string{"rollback", "1", "--wait", "--max-wait", "-5m"}, "--max-wait -5m0s: want 0s to"},
		{[]string{"rollout", "create", "r", "--routes", "chat", "--by", "tenant"}, `--by "tenant": want route or subject`},
		{[]string{"rollout", "set", "r", "--percent", "150"}, "--percent 150: want 0 to 100"},
		{[]string{"rollout", "set", "r", "--percent", "-5%"}, "--percent -5%: want 0 to 100"},
		{[]string{"rollout", "set", "r", "--percent", "NaN"}, `--percent "NaN" is not a number`},
		{[]string{"backlog", "--limit", "0"}, "--limit 0: want 1 to 1000"},
		{[]string{"backlog", "--limit", "5000"}, "--limit 5000: want 1 to 1000"},
		{[]string{"debts", "--limit", "1001"}, "--limit 1001: want 1 to 1000"},
		{[]string{"policy", "list", "--page-size", "0"}, "--page-size 0: want 1 to 1000"},
		{[]string{"policy", "list", "--page-size", "1001"}, "--page-size 1001: want 1 to 1000"},
		{[]string{"shard", "issue", "--subject", "t", "--route", "r", "--units", "tokens=1", "--gateway", "g", "--boot", "1", "--ttl", "-1h"},
			"--ttl -1h0m0s: want 1s to 2562047h47m16s (9223372036s, the API's longest duration)"},
		{[]string{"shard", "issue", "--subject", "t", "--route", "r", "--units", "tokens=1", "--gateway", "g", "--boot", "1", "--ttl", "2562047h47m16.5s"},
			"--ttl 2562047h47m16.5s: want 1s to 2562047h47m16s"},
		{[]string{"legacy", "carve", "--identity", "l", "--subject", "t", "--route", "r", "--units", "tokens=1", "--ttl", "10ms", "--id", "b"},
			"--ttl 10ms: want 1s to"},
		{[]string{"shard", "reconcile", "--gateway", "g", "--dir", dir, "--receipts", token}, "--dir reports the receipts the store in DIR keeps, --receipts those of a file: give one or the other"},
		{[]string{"shard", "inspect", "sh-1", "--keys", token}, "--keys verifies a --token-file offline"},
		{[]string{"reserve", "--subject", "t", "--route", "r", "--units", "tokens=9007199254740993"}, "--units: amount 9007199254740993 of tokens: want 0 to 9007199254740992"},
		{[]string{"settle", "x", "--operation", "op", "--units", "tokens=1,requests=9223372036854775807"}, "--units: amount 9223372036854775807 of requests: want 0 to 9007199254740992"},
		{[]string{"sim", "--workers", "100000"}, "--workers 100000: want 1 to 4096"},
		{[]string{"sim", "--reports", "-1"}, "--reports -1: want 0 to"},
		{[]string{"sim", "--last", "1000000000000000"}, "--last 1000000000000000: want 0 to 65536"},
		{[]string{"sim", "--gateways", "100000000"}, "--gateways 100000000: want 2 to 64"},
		{[]string{"sim", "--requests", "1000000000"}, "--requests 1000000000: want 1 to 256"},
		{[]string{"sim", "--tenants", "0"}, "--tenants 0: want 1 to 256"},
		{[]string{"sim", "--requests", "257"}, "--requests 257: want 1 to 256"},
		{[]string{"sim", "--executors", "65"}, "--executors 65: want 1 to 64"},
		{[]string{"sim", "--arrival-window", "10000h", "--heal-at", "10001h"}, "--arrival-window 10000h0m0s: want 1ns to 24h0m0s"},
		{[]string{"sim", "--deadline", "25h"}, "--deadline 25h0m0s: want 1ns to 24h0m0s"},
		{[]string{"sim", "--interleavings", "0"}, "--interleavings 0: want 1 to"},
	} {
		code, out, errOut := cli(t, "http://127.0.0.1:1", c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.says) {
			t.Errorf("capledger %s: exit %d (want %d), stderr lacks %q:\n%s%s", strings.Join(c.args, " "), code, exitUsage, c.says, out, errOut)
		}
	}
}
