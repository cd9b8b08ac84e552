package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
)

// testPKI is a private CA made for one test, which issues server
// certificates for 127.0.0.1.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string // the CA certificate, PEM
	pool   *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	return newNamedTestPKI(t, "capledger test CA")
}

// newNamedTestPKI is newTestPKI with the CA's common name.
func newNamedTestPKI(t *testing.T, name string) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(1000),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), ca: ca, caKey: key, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = filepath.Join(p.dir, "ca.crt")
	writePEM(t, p.caFile, "CERTIFICATE", der)
	return p
}

// issue writes a new key and a certificate for 127.0.0.1 with the given
// serial, signed by the CA, to certFile and keyFile. When the files
// existed, their modification time is moved a minute past the old one, so
// the rotation is visible also on a file system with coarse timestamps.
func (p *testPKI) issue(t *testing.T, certFile, keyFile string, serial int64) {
	t.Helper()
	p.sign(t, certFile, keyFile, &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "capledger test server"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// sign writes a new key and a certificate of template (unless it says
// otherwise valid from an hour ago for a day, for digital signatures),
// signed by the CA, to certFile and keyFile.
func (p *testPKI) sign(t *testing.T, certFile, keyFile string, template *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if template.NotBefore.IsZero() && template.NotAfter.IsZero() {
		template.NotBefore, template.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	}
	if template.KeyUsage == 0 {
		template.KeyUsage = x509.KeyUsageDigitalSignature
	}
	der, err := x509.CreateCertificate(rand.Reader, template, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	writePEM(t, certFile, "CERTIFICATE", der)
}

// writePEM writes one PEM block to path; an existing file's modification
// time moves a minute forward.
func writePEM(t *testing.T, path, blockType string, der []byte) {
	t.Helper()
	old, statErr := os.Stat(path)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if statErr == nil {
		later := old.ModTime().Add(time.Minute)
		if err := os.Chtimes(path, later, later); err != nil {
			t.Fatal(err)
		}
	}
}

// serveTLS starts serve in-process with a fresh certificate of the given
// serial and returns its host:port, log, and the pair's paths.
func serveTLS(t *testing.T, pki *testPKI, serial int64, extra ...string) (addr string, logs *lockedBuffer, certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(pki.dir, "tls.crt"), filepath.Join(pki.dir, "tls.key")
	pki.issue(t, certFile, keyFile, serial)
	addr, logs = serveInProcess(t, append([]string{"--tls-cert", certFile, "--tls-key", keyFile}, extra...)...)
	return addr, logs, certFile, keyFile
}

// runWithEnv runs one capledger command with the given context and
// environment.
func runWithEnv(ctx context.Context, vars map[string]string, args ...string) (int, string, string) {
	var stdout, stderr strings.Builder
	code := run(ctx, &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return vars[k] }}, args)
	return code, stdout.String(), stderr.String()
}

func TestServeTLSCLI(t *testing.T) {
	pki := newTestPKI(t)
	addr, logs, _, _ := serveTLS(t, pki, 1, "--log-level", "debug")
	if !strings.Contains(logs.String(), "tls=true") {
		t.Fatalf("the listening line does not say tls=true:\n%s", logs.String())
	}
	url := "https://" + addr
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte(policyYAML), 0o600)

	code, out, errOut := cli(t, url, "policy", "publish", policy, "--ca-file", pki.caFile)
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", "tokens=600,requests=1", "--id", "req-1", "--ca-file", pki.caFile)
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"state": "RESERVATION_STATE_RESERVED"`) {
		t.Fatalf("reserve printed %s", out)
	}
	// $CAPLEDGER_CA is --ca-file's default.
	code, out, errOut = runWithEnv(context.Background(), map[string]string{"CAPLEDGER_ADDR": url, "CAPLEDGER_CA": pki.caFile}, "get", "req-1")
	wantExit(t, exitOK, code, out, errOut)

	// Without the CA the system roots do not trust the server: exit 5
	// (the server is unreachable for this client), saying why and what
	// to do.
	code, out, errOut = cli(t, url, "get", "req-1")
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(errOut, "certificate") || !strings.Contains(errOut, "--ca-file") {
		t.Fatalf("an untrusted server certificate is not explained: %s", errOut)
	}
	// status reads /statusz over plain HTTP GET, and says the same.
	code, out, errOut = cli(t, url, "status")
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(errOut, "--ca-file") {
		t.Fatalf("status: an untrusted server certificate is not explained: %s", errOut)
	}
	code, out, errOut = cli(t, url, "status", "--ca-file", pki.caFile)
	wantExit(t, exitOK, code, out, errOut)
	// The server logs the refused handshake at debug level, not warn
	// (load balancers' TCP checks and port scans fail handshakes too).
	waitFor(t, "the failed handshake in the server log", func() bool {
		return strings.Contains(logs.String(), "TLS handshake error")
	}, logs)
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "TLS handshake error") && !strings.Contains(line, "level=DEBUG") {
			t.Fatalf("a failed handshake is logged above debug: %s", line)
		}
	}
	// bench goes through the Go SDK, which takes the same roots.
	code, out, errOut = cli(t, url, "bench", "--ca-file", pki.caFile, "--concurrency", "2", "--duration", "100ms", "--warmup", "0s", "--progress=false")
	wantExit(t, exitOK, code, out, errOut)
	if benchRow(t, out, "errors") != "0" {
		t.Fatalf("bench over TLS:\n%s", out)
	}
	// A CA bundle that does not load is a usage error.
	notPEM := filepath.Join(t.TempDir(), "not-a-ca.pem")
	os.WriteFile(notPEM, []byte("hello\n"), 0o600)
	for _, caFile := range []string{notPEM, filepath.Join(t.TempDir(), "missing.pem")} {
		code, out, errOut = cli(t, url, "get", "req-1", "--ca-file", caFile)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "--ca-file") {
			t.Fatalf("bad --ca-file %s: %s", caFile, errOut)
		}
	}
}

func TestServeTLSProtocols(t *testing.T) {
	pki := newTestPKI(t)
	addr, _, _, _ := serveTLS(t, pki, 1)
	url := "https://" + addr

	// Health, readiness and metrics over the same TLS port, as HTTP/2
	// (ALPN h2) and as HTTP/1.1.
	for _, wantMajor := range []int{2, 1} {
		transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}, ForceAttemptHTTP2: wantMajor == 2}
		hc := &http.Client{Transport: transport, Timeout: 10 * time.Second}
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := hc.Get(url + path)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.ProtoMajor != wantMajor {
				t.Errorf("GET %s: %s over %s, want 200 over HTTP/%d", path, resp.Status, resp.Proto, wantMajor)
			}
		}
		transport.CloseIdleConnections()
	}

	// The SDK's gRPC protocol needs HTTP/2, which over TLS only ALPN gives.
	c, err := client.New(url, client.WithTLS(&tls.Config{RootCAs: pki.pool}), client.WithProtocol(client.ProtocolGRPC))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, _, err := c.PublishPolicy(ctx, &v1.Policy{
		Subject: "tenant-7", Route: "chat.generate", HoldTtl: durationpb.New(30 * time.Second),
		Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: 1000}},
	}); err != nil {
		t.Fatalf("publish over gRPC+TLS: %v", err)
	}
	res, err := c.Reserve(ctx, client.ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: client.Units{"tokens": 600}})
	if err != nil {
		t.Fatalf("reserve over gRPC+TLS: %v", err)
	}
	if got := res.Reservation.GetState(); got != v1.ReservationState_RESERVATION_STATE_RESERVED {
		t.Fatalf("reserve over gRPC+TLS: state %s", got)
	}

	// A grpc-go client over TLS (ALPN h2) reaches grpc-go's transport,
	// which serves the LedgerService's hot methods directly.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var reserved v1.ReserveResponse
	if err := conn.Invoke(ctx, "/capledger.v1.LedgerService/Reserve", &v1.ReserveRequest{ReservationId: "grpc-go-tls",
		Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1}}, &reserved); err != nil {
		t.Fatalf("reserve with grpc-go over TLS: %v", err)
	}
	resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}).Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The SDK's and grpc-go's connections went to grpc-go; the HTTP/2 and
	// HTTP/1.1 GETs (and the start-up probes) to net/http.
	for _, want := range []string{`capledger_connections_total{server="grpc-go"} 2` + "\n", `capledger_connections_total{server="net/http"} `} {
		if !strings.Contains(string(metrics), want) || strings.Contains(string(metrics), `{server="net/http"} 0`) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(string(metrics), "capledger_connections_total"))
		}
	}
}

func grepLines(text, word string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// peerSerial makes a new TLS connection to addr and returns the serial of
// the certificate the server presented.
func peerSerial(t *testing.T, addr string, roots *x509.CertPool) int64 {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatalf("tls dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

func TestServeTLSRotation(t *testing.T) {
	pki := newTestPKI(t)
	addr, logs, certFile, keyFile := serveTLS(t, pki, 1)
	if got := peerSerial(t, addr, pki.pool); got != 1 {
		t.Fatalf("serial %d at start, want 1", got)
	}

	// A new key and certificate in the same files: new connections get
	// it once the reloader has looked (every tlsCheckInterval).
	pki.issue(t, certFile, keyFile, 2)
	waitFor(t, "the rotated certificate", func() bool { return peerSerial(t, addr, pki.pool) == 2 }, logs)
	if !strings.Contains(logs.String(), "tls certificate reloaded") {
		t.Fatalf("the reload is not logged:\n%s", logs.String())
	}

	// A pair that does not match is refused with a warning, and the
	// served certificate stays.
	otherCert, otherKey := filepath.Join(pki.dir, "other.crt"), filepath.Join(pki.dir, "other.key")
	pki.issue(t, otherCert, otherKey, 3)
	otherPEM, err := os.ReadFile(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := os.Stat(keyFile)
	os.WriteFile(keyFile, otherPEM, 0o600)
	os.Chtimes(keyFile, old.ModTime().Add(time.Minute), old.ModTime().Add(time.Minute))
	waitFor(t, "the warning about the mismatched pair", func() bool {
		peerSerial(t, addr, pki.pool) // a handshake is what triggers the check
		return strings.Contains(logs.String(), "not reloaded")
	}, logs)
	if got := peerSerial(t, addr, pki.pool); got != 2 {
		t.Fatalf("serial %d after a mismatched pair, want 2 (the last good one)", got)
	}
}

// waitFor polls cond until it holds, or fails the test after a deadline
// far beyond what the condition needs.
func waitFor(t *testing.T, what string, cond func() bool, logs *lockedBuffer) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not seen after 60s:\n%s", what, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestServeTLSRefusedAtStart(t *testing.T) {
	pki := newTestPKI(t)
	certFile, keyFile := filepath.Join(pki.dir, "a.crt"), filepath.Join(pki.dir, "a.key")
	pki.issue(t, certFile, keyFile, 1)
	otherCert, otherKey := filepath.Join(pki.dir, "b.crt"), filepath.Join(pki.dir, "b.key")
	pki.issue(t, otherCert, otherKey, 2)
	notPEM := filepath.Join(t.TempDir(), "not-a-ca.pem")
	os.WriteFile(notPEM, []byte("hello\n"), 0o600)

	// Cancelled from the start: a serve that wrongly accepts the flags
	// shuts down at once and exits 0 instead of running on.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		flags []string
		says  string
	}{
		{[]string{"--tls-cert", certFile}, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-key", keyFile}, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-cert", certFile, "--tls-key", otherKey}, "private key does not match"},
		{[]string{"--tls-cert", certFile, "--tls-key", filepath.Join(pki.dir, "missing.key")}, "no such file"},
		{[]string{"--tls-cert", pki.caFile + ".none", "--tls-key", keyFile}, "no such file"},
		// TLS does not stand in for tokens on a reachable address.
		{[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--addr", "0.0.0.0:0"}, "--tokens"},
		// --tls-client-ca: without --tls-cert, a file that holds no CA
		// certificate, and empty (an unset shell variable must not turn
		// client certificates off).
		{[]string{"--tls-client-ca", pki.caFile}, "--tls-client-ca needs --tls-cert"},
		{[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", notPEM}, "--tls-client-ca: " + notPEM + ": no PEM certificate"},
		{[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", notPEM + ".none"}, "no such file"},
		{[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", ""}, "--tls-client-ca: empty file name"},
	} {
		dataDir := t.TempDir()
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir}, c.flags...)
		code, out, errOut := runWithEnv(cancelled, nil, args...)
		if code != exitUsage || !strings.Contains(errOut, c.says) {
			t.Errorf("capledger %v: exit %d (want %d), output lacks %q:\n%s%s", args, code, exitUsage, c.says, out, errOut)
		}
		// Refused before the store was opened.
		if entries, _ := os.ReadDir(dataDir); len(entries) != 0 {
			t.Errorf("capledger %v left %d entries in the data directory", args, len(entries))
		}
	}
}

// TestCertReloaderWarnsOncePerChange drives the reloader with a test
// clock: it looks at the files only once the interval has passed, reloads
// a changed pair, keeps the last good certificate when a pair does not
// load, and warns once per change, not per handshake.
func TestCertReloaderWarnsOncePerChange(t *testing.T) {
	pki := newTestPKI(t)
	certFile, keyFile := filepath.Join(pki.dir, "tls.crt"), filepath.Join(pki.dir, "tls.key")
	pki.issue(t, certFile, keyFile, 1)
	var logBuf lockedBuffer
	r, err := newCertReloader(certFile, keyFile, slog.New(slog.NewTextHandler(&logBuf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	r.now = func() time.Time { return clock }
	tick := func() { clock = clock.Add(r.interval) }
	serial := func() int64 {
		t.Helper()
		cert, err := r.GetCertificate(nil)
		if err != nil || cert == nil {
			t.Fatalf("GetCertificate: %v, %v", cert, err)
		}
		return cert.Leaf.SerialNumber.Int64()
	}
	warnings := func() int { return strings.Count(logBuf.String(), "level=WARN") }

	pki.issue(t, certFile, keyFile, 2)
	if got := serial(); got != 1 {
		t.Fatalf("serial %d before the interval passed, want 1 (files not looked at yet)", got)
	}
	tick()
	if got := serial(); got != 2 {
		t.Fatalf("serial %d after the interval, want the rotated 2", got)
	}

	// Only the key changes, to another certificate's: refused, warned
	// about once however many handshakes and intervals follow.
	otherCert, otherKey := filepath.Join(pki.dir, "other.crt"), filepath.Join(pki.dir, "other.key")
	pki.issue(t, otherCert, otherKey, 3)
	otherPEM, _ := os.ReadFile(otherKey)
	old, _ := os.Stat(keyFile)
	os.WriteFile(keyFile, otherPEM, 0o600)
	os.Chtimes(keyFile, old.ModTime().Add(time.Minute), old.ModTime().Add(time.Minute))
	for range 3 {
		tick()
		if got := serial(); got != 2 {
			t.Fatalf("serial %d with a mismatched pair on disk, want 2 (the last good one)", got)
		}
	}
	if warnings() != 1 || !strings.Contains(logBuf.String(), "private key does not match") {
		t.Fatalf("want one warning about the mismatched pair:\n%s", logBuf.String())
	}

	// The certificate goes missing: a second change, a second warning.
	os.Remove(certFile)
	for range 3 {
		tick()
		if got := serial(); got != 2 {
			t.Fatalf("serial %d with the certificate file missing, want 2", got)
		}
	}
	if warnings() != 2 {
		t.Fatalf("want a second warning, for the missing file:\n%s", logBuf.String())
	}

	// A good pair again is served.
	pki.issue(t, certFile, keyFile, 4)
	tick()
	if got := serial(); got != 4 {
		t.Fatalf("serial %d after a good pair came back, want 4", got)
	}
}

// TestCertReloaderConcurrentHandshakes checks (under -race) that
// handshakes may ask for the certificate while another one reloads it.
func TestCertReloaderConcurrentHandshakes(t *testing.T) {
	pki := newTestPKI(t)
	certFile, keyFile := filepath.Join(pki.dir, "tls.crt"), filepath.Join(pki.dir, "tls.key")
	pki.issue(t, certFile, keyFile, 1)
	r, err := newCertReloader(certFile, keyFile, slog.New(slog.NewTextHandler(&lockedBuffer{}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.interval = 0 // every handshake checks the files
	r.nextCheck.Store(0)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				if cert, err := r.GetCertificate(nil); err != nil || cert == nil || cert.Leaf == nil {
					t.Errorf("GetCertificate: %v, %v", cert, err)
					return
				}
			}
		}()
	}
	for serial := int64(2); serial <= 6; serial++ {
		pki.issue(t, certFile, keyFile, serial)
	}
	wg.Wait()
	cert, _ := r.GetCertificate(nil)
	if got := cert.Leaf.SerialNumber.Int64(); got != 6 {
		t.Fatalf("serial %d after the last rotation, want 6", got)
	}
}
