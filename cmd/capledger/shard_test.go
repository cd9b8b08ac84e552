package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/server"
)

const emergencyPolicyYAML = `subject: tenant-7
route: chat.generate
emergencyMode: true
dimensions:
  - unit: tokens
    burst: 10000
`

func TestCLIShardLifecycle(t *testing.T) {
	dir := t.TempDir()
	// keygen writes a keys line; serve signs with it.
	code, keyLine, errOut := cli(t, "", "shard", "keygen", "--id", "ops-1")
	wantExit(t, exitOK, code, keyLine, errOut)
	keysPath := filepath.Join(dir, "keys")
	if err := os.WriteFile(keysPath, []byte(keyLine), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startInProcess(t, "--shard-keys", keysPath)
	policyPath := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policyPath, []byte(emergencyPolicyYAML), 0o600)
	code, out, errOut := cli(t, url, "policy", "publish", policyPath)
	wantExit(t, exitOK, code, out, errOut)

	code, out, errOut = cli(t, url, "shard", "keys")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.HasPrefix(out, "ops-1 public ") || !strings.Contains(out, "(signing)") {
		t.Fatalf("keys: %s", out)
	}

	code, out, errOut = cli(t, url, "shard", "issue", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", "tokens=2000", "--gateway", "gw-1", "--boot", "3", "--ttl", "15m", "--id", "sh-cli")
	wantExit(t, exitOK, code, out, errOut)
	var issued struct {
		Shard struct {
			Token          string `json:"token"`
			KeyID          string `json:"keyId"`
			SignatureValid bool   `json:"signatureValid"`
		} `json:"shard"`
	}
	if err := json.Unmarshal([]byte(out), &issued); err != nil || issued.Shard.KeyID != "ops-1" || !issued.Shard.SignatureValid {
		t.Fatalf("issue printed %s (%v)", out, err)
	}
	// Too large for what is left: exit 2, like a rejected reservation.
	code, out, errOut = cli(t, url, "shard", "issue", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", "tokens=9000", "--gateway", "gw-1", "--boot", "3")
	wantExit(t, exitRejected, code, out, errOut)

	code, out, errOut = cli(t, url, "shard", "list", "--unreconciled")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "sh-cli") || !strings.Contains(out, "tokens=2000") || !strings.Contains(out, "live") {
		t.Fatalf("list: %s", out)
	}

	// Offline inspection of the token, verified with the keys file; a
	// tampered copy fails with exit 4.
	tokenPath := filepath.Join(dir, "token")
	os.WriteFile(tokenPath, []byte(issued.Shard.Token), 0o600)
	code, out, errOut = cli(t, url, "shard", "inspect", "--token-file", tokenPath, "--keys", keysPath)
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"signatureValid": true`) || !strings.Contains(out, `"gatewayId": "gw-1"`) {
		t.Fatalf("inspect token: %s", out)
	}
	raw, _ := base64.StdEncoding.DecodeString(issued.Shard.Token)
	raw[30] ^= 1
	os.WriteFile(tokenPath, []byte(base64.StdEncoding.EncodeToString(raw)), 0o600)
	code, out, errOut = cli(t, url, "shard", "inspect", "--token-file", tokenPath, "--keys", keysPath)
	wantExit(t, exitConflict, code, out, errOut)

	// A misspelt field must not read as zero usage: refused before sending.
	typoPath := filepath.Join(dir, "typo.json")
	os.WriteFile(typoPath, []byte(`[{"reservation_id": "l1", "state": "SETTLED", "reserved_units": {"tokens": 500}, "actual_unit": {"tokens": 450}}]`), 0o600)
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-cli", "--gateway", "gw-1", "--receipts", typoPath)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "actual_unit") {
		t.Fatalf("misspelt receipt field: %s", errOut)
	}

	// Two arrays in one file (two receipt logs concatenated): the decoder
	// read the first and dropped the second without a word, and a receipt
	// left out reads as unused capacity, reminted. Refused before sending.
	concatPath := filepath.Join(dir, "concat.json")
	os.WriteFile(concatPath, []byte(`[{"reservation_id": "l1", "state": "SETTLED", "reserved_units": {"tokens": 500}, "actual_units": {"tokens": 450}}]
[{"reservation_id": "l2", "state": "usage_unknown", "reserved_units": {"tokens": 300}}]`), 0o600)
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-cli", "--gateway", "gw-1", "--receipts", concatPath)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "line 2, column 1: more than one document in the file") {
		t.Fatalf("concatenated receipts: %s", errOut)
	}

	receiptsPath := filepath.Join(dir, "receipts.json")
	os.WriteFile(receiptsPath, []byte(`[
	  {"reservation_id": "l1", "state": "SETTLED", "reserved_units": {"tokens": 500}, "actual_units": {"tokens": 450}},
	  {"reservation_id": "l2", "state": "usage_unknown", "reserved_units": {"tokens": 300}}
	]`), 0o600)
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-cli", "--gateway", "gw-1", "--receipts", receiptsPath)
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"tokens": "1250"`) {
		t.Fatalf("reconcile should remint 2000 - 450 - 300 = 1250: %s", out)
	}
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-cli", "--gateway", "gw-1", "--receipts", receiptsPath)
	wantExit(t, exitConflict, code, out, errOut)
	if !strings.Contains(errOut, "SHARD_ALREADY_RECONCILED") {
		t.Fatalf("second submission: %s", errOut)
	}
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-cli", "--gateway", "gw-2")
	wantExit(t, exitConflict, code, out, errOut)
	code, out, errOut = cli(t, url, "shard", "inspect", "sh-cli")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"refusedSubmissions": "2"`) || !strings.Contains(out, `"unknownUnits"`) {
		t.Fatalf("inspect: %s", out)
	}
	code, out, errOut = cli(t, url, "shard", "inspect", "sh-none")
	wantExit(t, exitNotFound, code, out, errOut)

	// The API's JSON form of a receipt (lowerCamelCase names, the enum's
	// full name, int64s as strings), as ReconcileShard takes it, was
	// refused as unknown fields; either naming is read, mixed too, and a
	// field neither form has is still refused before sending.
	code, out, errOut = cli(t, url, "shard", "issue", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", "tokens=1000", "--gateway", "gw-1", "--boot", "3", "--id", "sh-camel")
	wantExit(t, exitOK, code, out, errOut)
	camelTypo := filepath.Join(dir, "camel-typo.json")
	os.WriteFile(camelTypo, []byte(`[{"reservationId": "c1", "state": "RESERVATION_STATE_SETTLED", "reservedUnits": {"tokens": "500"}, "actualUnit": {"tokens": "450"}}]`), 0o600)
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-camel", "--gateway", "gw-1", "--receipts", camelTypo)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "actualUnit") {
		t.Fatalf("misspelt camelCase receipt field: %s", errOut)
	}
	camelPath := filepath.Join(dir, "camel.json")
	os.WriteFile(camelPath, []byte(`[
	  {"reservationId": "c1", "state": "RESERVATION_STATE_SETTLED", "reservedUnits": {"tokens": "500"}, "actualUnits": {"tokens": "450"}},
	  {"reservation_id": "c2", "state": "SETTLED_WITH_DEBT", "reservedUnits": {"tokens": 100}, "actual_units": {"tokens": 150}}
	]`), 0o600)
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-camel", "--gateway", "gw-1", "--receipts", camelPath)
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"tokens": "400"`) {
		t.Fatalf("reconcile should remint 1000 - 450 - 150 = 400: %s", out)
	}

	// A stopped gateway's shard directory, reconciled by an operator.
	storeDir := filepath.Join(dir, "gw-dir")
	st, err := client.OpenShardStore(storeDir, client.ShardStoreOptions{GatewayID: "gw-dir"})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, url, "shard", "issue", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", "tokens=400", "--gateway", "gw-dir", "--boot", strconv.FormatUint(st.BootEpoch(), 10), "--id", "sh-dir")
	wantExit(t, exitOK, code, out, errOut)
	if err := json.Unmarshal([]byte(out), &issued); err != nil {
		t.Fatal(err)
	}
	token, _ := base64.StdEncoding.DecodeString(issued.Shard.Token)
	keys, err := server.ParseShardKeys(strings.NewReader(keyLine), "test keys")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Install(token, []string{"tokens"}, keys); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve("loc-1", "d", "tenant-7", "chat.generate", "", client.Units{"tokens": 100}); err != nil {
		t.Fatal(err)
	}
	st.Start("loc-1", "op-1")
	if _, err := st.Settle("loc-1", "op-1", client.Units{"tokens": 70}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"loc-2", "loc-3"} { // left unstarted, left running
		if _, err := st.Reserve(id, "d", "tenant-7", "chat.generate", "", client.Units{"tokens": 50}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Start("loc-3", "op-3"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	// The receipts a reconciliation would send, printed as a --receipts
	// file for a reconciliation by hand; printing them sends nothing.
	code, out, errOut = cli(t, "", "shard", "receipts", "sh-dir", "--dir", storeDir, "--gateway", "gw-dir")
	wantExit(t, exitOK, code, out, errOut)
	printed, err := parseReceipts([]byte(out))
	if err != nil {
		t.Fatalf("shard receipts printed no --receipts file: %v\n%s", err, out)
	}
	if len(printed) != 3 || printed[0].GetReservationId() != "loc-1" || printed[0].GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED ||
		printed[0].GetReservedUnits()["tokens"] != 100 || printed[0].GetActualUnits()["tokens"] != 70 ||
		printed[1].GetState() != v1.ReservationState_RESERVATION_STATE_RELEASED || printed[2].GetState() != v1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN {
		t.Fatalf("shard receipts: %s", out)
	}
	code, out, errOut = cli(t, "", "shard", "receipts", "sh-none", "--dir", storeDir, "--gateway", "gw-dir")
	wantExit(t, exitNotFound, code, out, errOut)
	code, out, errOut = cli(t, "", "shard", "receipts", "sh-dir", "--dir", filepath.Join(dir, "no-such-store"), "--gateway", "gw-dir")
	wantExit(t, exitUsage, code, out, errOut)
	code, out, errOut = cli(t, url, "shard", "reconcile", "--dir", storeDir, "--gateway", "gw-dir")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "sh-dir: 3 receipts, reminted map[tokens:280]") {
		t.Fatalf("reconcile --dir: %s", out)
	}
	code, out, errOut = cli(t, url, "shard", "reconcile", "--dir", storeDir, "--gateway", "gw-dir")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "nothing to report") {
		t.Fatalf("second reconcile --dir: %s", out)
	}

	code, out, errOut = cli(t, url, "audit")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "shard", "frobnicate")
	wantExit(t, exitUsage, code, out, errOut)
}

// --shard-max-ttl 0 or below was taken silently for the default 24h
// (found by an outside pass): an operator who meant "no shards" or typed a
// sign wrong got day-long shards. It is refused before anything listens
// or opens (the unreachable store would otherwise answer exit 5).
func TestServeRefusesNonPositiveShardMaxTTL(t *testing.T) {
	for _, ttl := range []string{"0s", "-1h"} {
		code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:0", "--store", "postgres://127.0.0.1:1/none", "--shard-max-ttl", ttl)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "--shard-max-ttl") {
			t.Fatalf("--shard-max-ttl %s: %q does not say what is wrong", ttl, errOut)
		}
	}
}

// shard receipts prints [] both for the first report of a shard nothing
// was admitted from (a reconciliation is still due: it remints all of
// it) and for a shard with nothing to report; stderr says which, stdout
// stays a --receipts file.
func TestCLIShardReceiptsSaysWhichEmptyList(t *testing.T) {
	dir := t.TempDir()
	code, keyLine, errOut := cli(t, "", "shard", "keygen", "--id", "ops-1")
	wantExit(t, exitOK, code, keyLine, errOut)
	keysPath := filepath.Join(dir, "keys")
	if err := os.WriteFile(keysPath, []byte(keyLine), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startInProcess(t, "--shard-keys", keysPath)
	policyPath := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policyPath, []byte(emergencyPolicyYAML), 0o600)
	code, out, errOut := cli(t, url, "policy", "publish", policyPath)
	wantExit(t, exitOK, code, out, errOut)

	storeDir := filepath.Join(dir, "gw-dir")
	st, err := client.OpenShardStore(storeDir, client.ShardStoreOptions{GatewayID: "gw-dir"})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, url, "shard", "issue", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", "tokens=400", "--gateway", "gw-dir", "--boot", strconv.FormatUint(st.BootEpoch(), 10), "--id", "sh-unused")
	wantExit(t, exitOK, code, out, errOut)
	var issued struct {
		Shard struct {
			Token string `json:"token"`
		} `json:"shard"`
	}
	if err := json.Unmarshal([]byte(out), &issued); err != nil {
		t.Fatal(err)
	}
	token, _ := base64.StdEncoding.DecodeString(issued.Shard.Token)
	keys, err := server.ParseShardKeys(strings.NewReader(keyLine), "test keys")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Install(token, []string{"tokens"}, keys); err != nil {
		t.Fatal(err)
	}
	st.Close() // nothing admitted from it

	receipts := func() (string, string) {
		t.Helper()
		code, out, errOut := cli(t, "", "shard", "receipts", "sh-unused", "--dir", storeDir, "--gateway", "gw-dir")
		wantExit(t, exitOK, code, out, errOut)
		if printed, err := parseReceipts([]byte(out)); err != nil || len(printed) != 0 {
			t.Fatalf("shard receipts printed %q (%v): want an empty --receipts file", out, err)
		}
		return out, errOut
	}
	if _, errOut := receipts(); !strings.Contains(errOut, "first report") {
		t.Fatalf("unused shard, never reconciled: stderr %q does not say its first report is due", errOut)
	}
	code, out, errOut = cli(t, url, "shard", "reconcile", "--dir", storeDir, "--gateway", "gw-dir")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "sh-unused: 0 receipts, reminted map[tokens:400]") {
		t.Fatalf("reconcile --dir: %s", out)
	}
	if _, errOut := receipts(); !strings.Contains(errOut, "nothing to report") {
		t.Fatalf("reconciled shard: stderr %q does not say there is nothing to report", errOut)
	}
}

// docs/OPERATIONS.md promises that a key appended to the keys file is
// picked up and logged ("shard keys reloaded") within a second or two.
// The ring looked at its file only when a shard was issued or verified or
// the keys listed, so on a server issuing nothing the operator appending a
// key saw no log line, and a half-pasted line no warning, until the next
// issuance. Nothing here calls the server between the edit and the log.
func TestServeLogsShardKeyRotationWithoutTraffic(t *testing.T) {
	keysPath := filepath.Join(t.TempDir(), "keys")
	code, first, errOut := cli(t, "", "shard", "keygen", "--id", "rot-1")
	wantExit(t, exitOK, code, first, errOut)
	if err := os.WriteFile(keysPath, []byte(first), 0o600); err != nil {
		t.Fatal(err)
	}
	url, logs := serveInProcess(t, "--shard-keys", keysPath)
	appendLine := func(line string) {
		t.Helper()
		f, err := os.OpenFile(keysPath, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	waitLog := func(want string) {
		t.Helper()
		// 1.5 s at most by design; slack for a loaded machine.
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(logs.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s in the log 5 s after the edit:\n%s", want, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	appendLine("rot-2 private half-pasted\n")
	waitLog(`msg="shard keys not reloaded: keeping the previous ones"`)

	code, second, errOut := cli(t, "", "shard", "keygen", "--id", "rot-2")
	wantExit(t, exitOK, code, second, errOut)
	if err := os.WriteFile(keysPath, []byte(first+second), 0o600); err != nil {
		t.Fatal(err)
	}
	waitLog(`msg="shard keys reloaded"`)
	if !strings.Contains(logs.String(), "signing=rot-2") {
		t.Fatalf("the reload does not name the new signing key:\n%s", logs.String())
	}
	code, out, errOut := cli(t, url, "shard", "keys")
	wantExit(t, exitOK, code, out, errOut)
	if !regexp.MustCompile(`(?m)^rot-2 public \S+ +\(signing\)$`).MatchString(out) {
		t.Fatalf("shard keys after the rotation:\n%s", out)
	}
}

// OPERATIONS.md: a file with private keys must be mode 600. A chmod
// alone that makes the keys file readable by others, its content the
// same, is noticed as an edit is: "shard keys not reloaded" naming the
// mode, the previous keys kept; chmod 600 again reloads it.
func TestServeNoticesAChmodOfTheShardKeysFile(t *testing.T) {
	keysPath := filepath.Join(t.TempDir(), "keys")
	code, first, errOut := cli(t, "", "shard", "keygen", "--id", "mode-1")
	wantExit(t, exitOK, code, first, errOut)
	if err := os.WriteFile(keysPath, []byte(first), 0o600); err != nil {
		t.Fatal(err)
	}
	url, logs := serveInProcess(t, "--shard-keys", keysPath)
	waitLog := func(want string) {
		t.Helper()
		// 1.5 s at most by design; slack for a loaded machine.
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(logs.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s in the log 5 s after the chmod:\n%s", want, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := os.Chmod(keysPath, 0o644); err != nil {
		t.Fatal(err)
	}
	waitLog(`msg="shard keys not reloaded: keeping the previous ones"`)
	if !strings.Contains(logs.String(), "chmod 600 it") {
		t.Fatalf("the refusal does not say to chmod 600 the file:\n%s", logs.String())
	}
	if err := os.Chmod(keysPath, 0o600); err != nil {
		t.Fatal(err)
	}
	waitLog(`msg="shard keys reloaded"`)
	code, out, errOut := cli(t, url, "shard", "keys")
	wantExit(t, exitOK, code, out, errOut)
	if !regexp.MustCompile(`(?m)^mode-1 public \S+ +\(signing\)$`).MatchString(out) {
		t.Fatalf("shard keys after the chmod back:\n%s", out)
	}
}

// serve --shard-max-ttl takes any positive Go duration, up to about 292
// years; a shard ttl near such a raised maximum put the expiry past
// 2262-04-11, which the stores (int64 Unix nanoseconds) cannot keep: the
// issuance answered 503 ("retry with the same ids"), which no retry cured.
// The expiry is that latest time instead, as a hold's is, on SQLite and on
// PostgreSQL, and the stored shard reads back with it.
func TestShardTTLNearARaisedMaximumExpiresAtTheLatestStorableTime(t *testing.T) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			args := []string{"--shard-max-ttl", "2562047h"}
			if store == "postgres" {
				args = append(args, "--store", postgresSchema(t))
			}
			url := startInProcess(t, args...)
			policyPath := filepath.Join(t.TempDir(), "policy.yaml")
			os.WriteFile(policyPath, []byte(emergencyPolicyYAML), 0o600)
			code, out, errOut := cli(t, url, "policy", "publish", policyPath)
			wantExit(t, exitOK, code, out, errOut)
			code, out, errOut = cli(t, url, "shard", "issue", "--subject", "tenant-7", "--route", "chat.generate",
				"--units", "tokens=100", "--gateway", "gw-1", "--boot", "1", "--ttl", "2500000h", "--id", "sh-far")
			wantExit(t, exitOK, code, out, errOut)
			const latest = `"expiresAt": "2262-04-11T23:47:16.854775807Z"`
			if !strings.Contains(out, latest) || !strings.Contains(out, `"signatureValid": true`) {
				t.Fatalf("issued: %s", out)
			}
			code, out, errOut = cli(t, url, "shard", "inspect", "sh-far")
			wantExit(t, exitOK, code, out, errOut)
			if !strings.Contains(out, latest) || !strings.Contains(out, `"signatureValid": true`) {
				t.Fatalf("read back: %s", out)
			}
		})
	}
}

// An emergency shard reconciled after a generation that drops one of its
// units took over: its usage beyond the shard in the dropped unit is
// charged (debtUnits) to the shard's own generation, which freezes the
// subject (ADMISSION_FROZEN naming the unit) until its refill repays it,
// and the audit stays clean. Before, that usage was charged nowhere.
func TestCLIShardOveruseInADroppedUnitFreezes(t *testing.T) {
	dir := t.TempDir()
	code, keyLine, errOut := cli(t, "", "shard", "keygen", "--id", "ops-1")
	wantExit(t, exitOK, code, keyLine, errOut)
	keysPath := filepath.Join(dir, "keys")
	if err := os.WriteFile(keysPath, []byte(keyLine), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startInProcess(t, "--shard-keys", keysPath)
	publish := func(name, yaml string) {
		t.Helper()
		path := filepath.Join(dir, name)
		os.WriteFile(path, []byte(yaml), 0o600)
		code, out, errOut := cli(t, url, "policy", "publish", path)
		wantExit(t, exitOK, code, out, errOut)
	}
	publish("g1.yaml", emergencyPolicyYAML+`  - unit: requests
    burst: 2
    refillUnits: 1
    refillInterval: 1h
`)
	code, out, errOut := cli(t, url, "shard", "issue", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", "tokens=100,requests=1", "--gateway", "gw-1", "--boot", "1", "--id", "sh-drop")
	wantExit(t, exitOK, code, out, errOut)
	publish("g2.yaml", emergencyPolicyYAML) // tokens only: requests dropped
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10", "--id", "before")
	wantExit(t, exitOK, code, out, errOut)

	receiptsPath := filepath.Join(dir, "receipts.json")
	os.WriteFile(receiptsPath, []byte(`[
	  {"reservation_id": "l1", "state": "SETTLED_WITH_DEBT", "reserved_units": {"tokens": 100, "requests": 1}, "actual_units": {"tokens": 100, "requests": 4}}
	]`), 0o600)
	code, out, errOut = cli(t, url, "shard", "reconcile", "sh-drop", "--gateway", "gw-1", "--receipts", receiptsPath)
	wantExit(t, exitOK, code, out, errOut)
	var rec struct {
		DebtUnits        map[string]string `json:"debtUnits"`
		RemintGeneration string            `json:"remintGeneration"`
	}
	if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.DebtUnits["requests"] != "3" || rec.RemintGeneration != "2" {
		t.Fatalf("reconcile printed %s (%v); want 3 requests charged beyond the shard of 1, the move to generation 2", out, err)
	}
	// 1 request left behind on generation 1 repays 1 of the 3: 2 owed,
	// an hour each.
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10", "--id", "after")
	wantExit(t, exitRejected, code, out, errOut)
	if !strings.Contains(errOut, "ADMISSION_FROZEN") || !strings.Contains(errOut, "requests") {
		t.Fatalf("reserve while generation 1 owes requests: %s", errOut)
	}
	code, out, errOut = cli(t, url, "audit")
	wantExit(t, exitOK, code, out, errOut)
}
