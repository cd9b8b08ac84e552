package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
)

// issueClient writes a new key and a client certificate (client auth
// usage) named name, signed by the CA, to certFile and keyFile.
func (p *testPKI) issueClient(t *testing.T, certFile, keyFile, name string) {
	t.Helper()
	p.issueClientWith(t, certFile, keyFile, name, nil)
}

// issueClientWith is issueClient with the template changed by edit first.
func (p *testPKI) issueClientWith(t *testing.T, certFile, keyFile, name string, edit func(*x509.Certificate)) {
	t.Helper()
	template := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if edit != nil {
		edit(template)
	}
	p.sign(t, certFile, keyFile, template)
}

// A client certificate the client CA signed but the server cannot accept
// (expired, or server-auth usage only) exits 1 saying what to pass, every
// time: the server's refusal mostly reaches the client as a reset
// connection, which alone reads as an unavailable server (exit 5), or
// in Connect's words as "canceled". The
// same certificates are no obstacle to a server that asks for none. bench
// (the SDK, and grpc-go for --mode envoy) exits 1 the same way without a
// certificate.
func TestServeMutualTLSUnusableClientCertificate(t *testing.T) {
	pki, clients := newTestPKI(t), newNamedTestPKI(t, "capledger test client CA")
	mapping := filepath.Join(t.TempDir(), "bench.yaml")
	os.WriteFile(mapping, []byte("domains:\n  - name: bench\n    rules:\n      - subject: {key: tenant}\n        route: {value: bench.reserve}\n        unit: tokens\n"), 0o600)
	addr, _, _, _ := serveTLS(t, pki, 1, "--tls-client-ca", clients.caFile, "--envoy-config", mapping)
	plainPKI := newTestPKI(t)
	plainAddr, _, _, _ := serveTLS(t, plainPKI, 1)
	dir := t.TempDir()
	expiredCert, expiredKey := filepath.Join(dir, "expired.crt"), filepath.Join(dir, "expired.key")
	clients.issueClientWith(t, expiredCert, expiredKey, "expired", func(c *x509.Certificate) {
		c.NotBefore, c.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	})
	serverCert, serverKey := filepath.Join(dir, "server-usage.crt"), filepath.Join(dir, "server-usage.key")
	clients.issueClientWith(t, serverCert, serverKey, "server usage", func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	futureCert, futureKey := filepath.Join(dir, "future.crt"), filepath.Join(dir, "future.key")
	clients.issueClientWith(t, futureCert, futureKey, "not yet valid", func(c *x509.Certificate) {
		c.NotBefore, c.NotAfter = time.Now().Add(24*time.Hour), time.Now().Add(48*time.Hour)
	})
	for _, c := range []struct{ name, cert, key string }{{"expired", expiredCert, expiredKey},
		{"not yet valid", futureCert, futureKey}, {"server-auth usage only", serverCert, serverKey}} {
		args := []string{"get", "req-1", "--cert", c.cert, "--key", c.key}
		for range 30 {
			code, out, errOut := cli(t, "https://"+addr, append(args, "--ca-file", pki.caFile)...)
			// A reset connection reads "canceled" in Connect's words;
			// nobody cancelled anything.
			if code != exitUsage || !strings.Contains(errOut, "--cert") || strings.Contains(errOut, "canceled") {
				t.Fatalf("%s certificate: exit %d, want %d saying --cert (and not canceled)\n%s%s", c.name, code, exitUsage, out, errOut)
			}
		}
		code, out, errOut := cli(t, "https://"+plainAddr, append(args, "--ca-file", plainPKI.caFile)...)
		wantExit(t, exitNotFound, code, out, errOut)
	}
	for _, args := range [][]string{
		{"bench", "--mode", "reserve", "--duration", "1s", "--warmup", "0s", "--concurrency", "1"},
		{"bench", "--mode", "reserve", "--protocol", "grpc", "--setup=false", "--duration", "1s", "--warmup", "0s", "--concurrency", "1"},
		{"bench", "--mode", "envoy", "--setup=false", "--duration", "1s", "--warmup", "0s", "--concurrency", "1"},
	} {
		code, out, errOut := cli(t, "https://"+addr, append(args, "--ca-file", pki.caFile)...)
		if code != exitUsage || !strings.Contains(errOut, "--cert") {
			t.Errorf("%v without a certificate: exit %d, want %d saying --cert\n%s%s", args, code, exitUsage, out, errOut)
		}
	}
}

// With --tls-client-ca every connection needs a client certificate the
// client CA signed: the CLI with --cert and --key (or $CAPLEDGER_CERT and
// $CAPLEDGER_KEY), status, the SDK over gRPC and a grpc-go client with
// one are served; without one, or with one another CA signed, the CLI
// exits 1 saying what to pass, and probes, metrics and gRPC calls are
// refused too.
func TestServeMutualTLS(t *testing.T) {
	pki, clients := newTestPKI(t), newNamedTestPKI(t, "capledger test client CA")
	addr, logs, _, _ := serveTLS(t, pki, 1, "--tls-client-ca", clients.caFile)
	if !strings.Contains(logs.String(), `msg="tls client certificates required"`) {
		t.Fatalf("the start log does not say client certificates are required:\n%s", logs.String())
	}
	url := "https://" + addr
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "gw.crt"), filepath.Join(dir, "gw.key")
	clients.issueClient(t, certFile, keyFile, "gateway-1")
	strangerCert, strangerKey := filepath.Join(dir, "other.crt"), filepath.Join(dir, "other.key")
	pki.issueClient(t, strangerCert, strangerKey, "stranger")
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte(policyYAML), 0o600)

	withCert := []string{"--ca-file", pki.caFile, "--cert", certFile, "--key", keyFile}
	code, out, errOut := cli(t, url, append([]string{"policy", "publish", policy}, withCert...)...)
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, append([]string{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=600,requests=1", "--id", "req-1"}, withCert...)...)
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = runWithEnv(context.Background(), map[string]string{"CAPLEDGER_ADDR": url, "CAPLEDGER_CA": pki.caFile,
		"CAPLEDGER_CERT": certFile, "CAPLEDGER_KEY": keyFile}, "get", "req-1")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, append([]string{"status"}, withCert...)...)
	wantExit(t, exitOK, code, out, errOut)

	for _, c := range []struct {
		name string
		args []string
	}{
		{"no certificate", []string{"get", "req-1", "--ca-file", pki.caFile}},
		{"status without one", []string{"status", "--ca-file", pki.caFile}},
		{"a certificate another CA signed", []string{"get", "req-1", "--ca-file", pki.caFile, "--cert", strangerCert, "--key", strangerKey}},
	} {
		code, out, errOut := cli(t, url, c.args...)
		if code != exitUsage || !strings.Contains(errOut, "--cert") {
			t.Errorf("%s: exit %d, want %d saying --cert\n%s%s", c.name, code, exitUsage, out, errOut)
		}
	}
	// --cert without --key (and a key of another certificate) is a usage
	// error before anything is sent.
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--cert", certFile}, "--cert and --key go together"},
		{[]string{"--key", keyFile}, "--cert and --key go together"},
		{[]string{"--cert", certFile, "--key", strangerKey}, "private key does not match"},
	} {
		code, out, errOut := cli(t, url, append([]string{"get", "req-1", "--ca-file", pki.caFile}, c.args...)...)
		if code != exitUsage || !strings.Contains(errOut, c.says) {
			t.Errorf("%v: exit %d, want %d saying %q\n%s%s", c.args, code, exitUsage, c.says, out, errOut)
		}
	}

	// Probes and metrics need one too.
	clientCert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, certs := range [][]tls.Certificate{nil, {clientCert}} {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool, Certificates: certs}}}
		resp, err := hc.Get(url + "/readyz")
		if certs == nil {
			if err == nil {
				resp.Body.Close()
				t.Fatalf("GET /readyz without a client certificate: %s", resp.Status)
			}
			continue
		}
		if err != nil {
			t.Fatalf("GET /readyz with a client certificate: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /readyz with a client certificate: %s", resp.Status)
		}
	}

	// The SDK over gRPC, and grpc-go's own client, with and without.
	ctx := context.Background()
	sdk, err := client.New(url, client.WithTLS(&tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{clientCert}}), client.WithProtocol(client.ProtocolGRPC))
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	if _, err := sdk.Reserve(ctx, client.ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: client.Units{"tokens": 1, "requests": 1}}); err != nil {
		t.Fatalf("SDK reserve over mTLS: %v", err)
	}
	for _, certs := range [][]tls.Certificate{{clientCert}, nil} {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.pool, Certificates: certs})))
		if err != nil {
			t.Fatal(err)
		}
		var reserved v1.ReserveResponse
		err = conn.Invoke(ctx, "/capledger.v1.LedgerService/Reserve", &v1.ReserveRequest{ReservationId: "grpc-go-mtls-" + time.Now().String(),
			Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1, "requests": 1}}, &reserved)
		conn.Close()
		if (err == nil) != (certs != nil) {
			t.Fatalf("grpc-go reserve with %d client certificates: %v", len(certs), err)
		}
	}
}

// A proxy in front of the ledger that asks for a client certificate but
// does not require one (tls.RequestClientCert): the CLI without one gets
// the ledger's answers and their exit codes (3 for a reservation it does
// not know), not "pass --cert" (exit 1). bench gets through too.
func TestServeMutualTLSOptionalClientCertificate(t *testing.T) {
	backend, err := neturl.Parse(startInProcess(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(backend))
	proxy.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	proxy.StartTLS()
	t.Cleanup(proxy.Close)
	caFile := filepath.Join(t.TempDir(), "proxy-ca.crt")
	writePEM(t, caFile, "CERTIFICATE", proxy.Certificate().Raw)

	code, out, errOut := cli(t, proxy.URL, "get", "no-such-reservation", "--ca-file", caFile)
	wantExit(t, exitNotFound, code, out, errOut)
	code, out, errOut = cli(t, proxy.URL, "bench", "--mode", "reserve", "--duration", "1s", "--warmup", "0s", "--concurrency", "1", "--ca-file", caFile)
	wantExit(t, exitOK, code, out, errOut)
}

// A proxy that asked for a client certificate and then went away: the
// calls that cannot reach it any more are failures to connect, not a
// refused certificate (exit 5 and the dial error, not "pass --cert"),
// both through the CLI's HTTP client and in the wording of an SDK or
// grpc-go command's failure.
func TestOptionalClientCertificateProxyGoneIsNotARefusal(t *testing.T) {
	proxy := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	proxy.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	proxy.StartTLS()
	caFile := filepath.Join(t.TempDir(), "proxy-ca.crt")
	writePEM(t, caFile, "CERTIFICATE", proxy.Certificate().Raw)

	e := &env{}
	c := &clientFlags{addr: proxy.URL, caFile: caFile, timeout: 5 * time.Second, certUnmet: new(atomic.Bool)}
	e.certUnmet = c.certUnmet
	hc, err := c.httpClient()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(proxy.URL)
	if err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	resp.Body.Close()
	if !c.certUnmet.Load() {
		t.Fatal("the proxy's request for a certificate was not noted")
	}
	proxy.Close()
	_, err = hc.Get(proxy.URL)
	if err == nil {
		t.Fatal("a closed proxy answered")
	}
	if clientCertificateRefused(err) {
		t.Fatalf("a proxy gone is read as a refused certificate: %v", err)
	}
	if worded := certRefused(e, err); worded != err {
		t.Fatalf("certRefused words a proxy gone as a refused certificate: %v", worded)
	}
	grpcDial := status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`)
	if worded := certRefused(e, grpcDial); worded != grpcDial {
		t.Fatalf("certRefused words grpc-go's failure to dial as a refused certificate: %v", worded)
	}
}

// A server that asked for a client certificate this client has not got
// and closed the connection after the handshake, before its first HTTP/2
// frame (serve --tls-client-ca does, when its alert loses the race with
// the client's first read): the SDK's call fails as connect-go words it,
// unavailable and made up by the client, without the *url.Error around
// it ("unexpected EOF" here; "http2: client conn could not be
// established" against serve). bench, which calls
// through the SDK, then exited 5 without saying what to pass, about one
// run in six; it is a refused certificate (exit 1, pass --cert).
func TestCertRefusedConnectionClosedAfterTheHandshake(t *testing.T) {
	cert := httptest.NewUnstartedServer(nil)
	cert.StartTLS()
	defer cert.Close()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writePEM(t, caFile, "CERTIFICATE", cert.Certificate().Raw)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: cert.TLS.Certificates,
		ClientAuth: tls.RequestClientCert, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()

	e := &env{}
	c := &clientFlags{addr: "https://" + ln.Addr().String(), caFile: caFile, timeout: 5 * time.Second, certUnmet: new(atomic.Bool)}
	e.certUnmet = c.certUnmet
	sc, err := c.sdk(client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	_, err = sc.GetReservation(context.Background(), "req-1")
	if err == nil || !c.certUnmet.Load() {
		t.Fatalf("a server that closed every connection after asking for a certificate: %v, asked noted %v", err, c.certUnmet.Load())
	}
	worded := certRefused(e, err)
	if code := exitCode(worded); code != exitUsage || !strings.Contains(worded.Error(), "--cert") {
		t.Fatalf("%v: exit %d, want %d saying --cert", worded, code, exitUsage)
	}
}
