package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// writeBundle writes the CAs' certificates, PEM, to path; an existing
// file's modification time moves a minute forward (as writePEM does).
func writeBundle(t *testing.T, path string, cas ...*testPKI) {
	t.Helper()
	var bundle []byte
	for _, ca := range cas {
		bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.ca.Raw})...)
	}
	writeFileLater(t, path, bundle)
}

// writeFileLater writes data to path; an existing file's modification
// time moves a minute forward.
func writeFileLater(t *testing.T, path string, data []byte) {
	t.Helper()
	old, statErr := os.Stat(path)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if statErr == nil {
		later := old.ModTime().Add(time.Minute)
		if err := os.Chtimes(path, later, later); err != nil {
			t.Fatal(err)
		}
	}
}

// clientPair issues a client certificate named name signed by ca and
// returns it loaded.
func clientPair(t *testing.T, ca *testPKI, name string) tls.Certificate {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	ca.issueClient(t, certFile, keyFile, name)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// mtlsGet opens a new connection to addr presenting pair, resuming a
// session from cache when it holds one (nil: none), and GETs /healthz
// over HTTP/2. It
// returns nil when the server accepted the certificate (in TLS 1.3 the
// server's refusal arrives after the client's handshake, at the first
// read), and whether the session was resumed.
func mtlsGet(addr string, roots *x509.CertPool, pair tls.Certificate, cache tls.ClientSessionCache) (resumed bool, err error) {
	transport := &http.Transport{DisableKeepAlives: true, ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: roots,
		Certificates: []tls.Certificate{pair}, ClientSessionCache: cache}}
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport, Timeout: 10 * time.Second}).Get("https://" + addr + "/healthz")
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		// HTTP/2: the Config a handshake gets offers ALPN h2 (for gRPC).
		return false, fmt.Errorf("GET /healthz: %s over %s", resp.Status, resp.Proto)
	}
	return resp.TLS.DidResume, nil
}

// An operator rotates the client CA without restarting serve: a
// certificate of a new CA is refused until the new CA is appended to the
// bundle, then served; once the old CA is removed, old-CA certificates
// are refused on new connections, resumed sessions included; a bundle
// that does not load keeps the previous CAs serving, with a warning. Both
// gRPC transports: with grpc-go, server.Front does the handshakes; with
// net/http, net/http does.
func TestServeMutualTLSClientCARotation(t *testing.T) {
	for _, transport := range []string{"grpc-go", "net/http"} {
		t.Run(strings.ReplaceAll(transport, "/", "-"), func(t *testing.T) { testClientCARotation(t, transport) })
	}
}

func testClientCARotation(t *testing.T, grpcTransport string) {
	pki := newTestPKI(t)
	oldCA, newCA := newNamedTestPKI(t, "capledger old client CA"), newNamedTestPKI(t, "capledger new client CA")
	bundle := filepath.Join(t.TempDir(), "client-ca.pem")
	writeBundle(t, bundle, oldCA)
	addr, logs, _, _ := serveTLS(t, pki, 1, "--tls-client-ca", bundle, "--grpc-transport", grpcTransport)
	if !strings.Contains(logs.String(), `msg="tls client certificates required" ca=`+bundle+` certificates=1 cas="CN=capledger old client CA (sha256 `) {
		t.Fatalf("the start log does not describe the bundle:\n%s", logs.String())
	}
	oldClient, newClient := clientPair(t, oldCA, "old gateway"), clientPair(t, newCA, "new gateway")
	accepted := func(pair tls.Certificate) bool {
		_, err := mtlsGet(addr, pki.pool, pair, nil)
		return err == nil
	}
	if !accepted(oldClient) || accepted(newClient) {
		t.Fatalf("at start: old CA's client accepted %v, new CA's %v; want true, false", accepted(oldClient), accepted(newClient))
	}

	// Step 1: append the new CA. New connections with its certificates
	// are served once serve has looked (every tlsCheckInterval).
	writeBundle(t, bundle, oldCA, newCA)
	waitFor(t, "the new CA's client accepted", func() bool { return accepted(newClient) }, logs)
	if !accepted(oldClient) {
		t.Fatal("the old CA's client is refused while both CAs are in the bundle")
	}
	if !strings.Contains(logs.String(), `msg="tls client ca reloaded" certificates=2`) {
		t.Fatalf("the reload is not logged with the bundle's size:\n%s", logs.String())
	}

	// A session of the old CA's client, resumable.
	oldSessions := tls.NewLRUClientSessionCache(4)
	if _, err := mtlsGet(addr, pki.pool, oldClient, oldSessions); err != nil {
		t.Fatal(err)
	}
	if resumed, err := mtlsGet(addr, pki.pool, oldClient, oldSessions); err != nil || !resumed {
		t.Fatalf("the old CA's client did not resume its session (resumed %v): %v", resumed, err)
	}

	// A connection of the old CA's client, kept open.
	open := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{oldClient}}}}
	defer open.CloseIdleConnections()
	getOnOpen := func() (reused bool, err error) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/healthz", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}))
		resp, err := open.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("GET /healthz: %s", resp.Status)
		}
		return reused, nil
	}
	if _, err := getOnOpen(); err != nil {
		t.Fatal(err)
	}

	// Step 3: remove the old CA. Its certificates are refused on new
	// connections, also when the client resumes the session it had; the
	// connection open before goes on.
	writeBundle(t, bundle, newCA)
	waitFor(t, "the old CA's client refused", func() bool { return !accepted(oldClient) }, logs)
	if resumed, err := mtlsGet(addr, pki.pool, oldClient, oldSessions); err == nil {
		t.Fatalf("the old CA's client got in after its CA was removed (resumed %v)", resumed)
	}
	if reused, err := getOnOpen(); err != nil || !reused {
		t.Fatalf("the connection open before the old CA was removed: reused %v, %v", reused, err)
	}
	if !accepted(newClient) {
		t.Fatal("the new CA's client is refused after the old CA was removed")
	}

	// A bundle that no longer loads: warned about, and the new CA
	// keeps serving (and the old one stays out).
	writeFileLater(t, bundle, []byte("not a certificate\n"))
	waitFor(t, "the warning about the broken bundle", func() bool {
		accepted(newClient) // a handshake is what triggers the check
		return strings.Contains(logs.String(), "tls client ca not reloaded")
	}, logs)
	if !accepted(newClient) || accepted(oldClient) {
		t.Fatalf("with a broken bundle on disk: new CA's client accepted %v, old CA's %v; want true, false", accepted(newClient), accepted(oldClient))
	}
	if !strings.Contains(logs.String(), `msg="tls client ca not reloaded: keeping the previous one" err="--tls-client-ca: `+bundle+`: no PEM certificate in it"`) {
		t.Fatalf("the warning does not say why:\n%s", logs.String())
	}
}

// serveHandshakes accepts TLS connections with config on a loopback port
// and writes "ok\n" on each whose handshake succeeded. It returns the
// port's address.
func serveHandshakes(t *testing.T, config *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(10 * time.Second))
				tc := tls.Server(conn, config)
				if tc.Handshake() == nil {
					tc.Write([]byte("ok\n"))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestClientCAReloaderWarnsOncePerChange drives the client-CA bundle's
// reloader with a test clock, through real handshakes on a loopback
// port: the bundle is looked at only once the interval has passed, a
// changed bundle is served, one that does not load keeps the previous
// CAs and is warned about once per change, not per handshake.
func TestClientCAReloaderWarnsOncePerChange(t *testing.T) {
	pki := newTestPKI(t)
	oldCA, newCA := newNamedTestPKI(t, "capledger old client CA"), newNamedTestPKI(t, "capledger new client CA")
	certFile, keyFile := filepath.Join(pki.dir, "tls.crt"), filepath.Join(pki.dir, "tls.key")
	pki.issue(t, certFile, keyFile, 1)
	bundle := filepath.Join(t.TempDir(), "client-ca.pem")
	writeBundle(t, bundle, oldCA)
	var logBuf lockedBuffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	certs, err := newCertReloader(certFile, keyFile, log)
	if err != nil {
		t.Fatal(err)
	}
	cas, err := newClientCAReloader(bundle, log)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64 // handshakes read it on the server's goroutines
	clock.Store(time.Now().UnixNano())
	cas.now = func() time.Time { return time.Unix(0, clock.Load()) }
	tick := func() { clock.Add(int64(cas.interval)) }
	addr := serveHandshakes(t, serverTLSConfig(certs, cas))
	oldClient, newClient := clientPair(t, oldCA, "old gateway"), clientPair(t, newCA, "new gateway")
	accepted := func(pair tls.Certificate) bool {
		t.Helper()
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr,
			&tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pair}})
		if err != nil {
			return false
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		return err == nil && line == "ok\n"
	}
	warnings := func() int { return strings.Count(logBuf.String(), "level=WARN") }

	writeBundle(t, bundle, newCA)
	if !accepted(oldClient) || accepted(newClient) {
		t.Fatal("the bundle was re-read before the interval passed")
	}
	tick()
	if accepted(oldClient) || !accepted(newClient) {
		t.Fatal("the changed bundle is not served after the interval")
	}
	if !strings.Contains(logBuf.String(), `msg="tls client ca reloaded" certificates=1 cas="CN=capledger new client CA (sha256 `) {
		t.Fatalf("the reload is not logged with the bundle's CAs:\n%s", logBuf.String())
	}

	// Not PEM: refused, warned about once however many handshakes and
	// intervals follow.
	writeFileLater(t, bundle, []byte("-----BEGIN CERTIFICATE-----\nbroken\n"))
	for range 3 {
		tick()
		if !accepted(newClient) || accepted(oldClient) {
			t.Fatal("a broken bundle on disk changed the CAs served")
		}
	}
	if warnings() != 1 || !strings.Contains(logBuf.String(), "no PEM certificate") {
		t.Fatalf("want one warning about the broken bundle:\n%s", logBuf.String())
	}

	// The file goes missing: a second change, a second warning.
	os.Remove(bundle)
	for range 3 {
		tick()
		if !accepted(newClient) {
			t.Fatal("a missing bundle changed the CAs served")
		}
	}
	if warnings() != 2 || !strings.Contains(logBuf.String(), "--tls-client-ca: stat") {
		t.Fatalf("want a second warning, for the missing file:\n%s", logBuf.String())
	}

	// A good bundle again is served.
	writeBundle(t, bundle, oldCA)
	tick()
	if !accepted(oldClient) || accepted(newClient) {
		t.Fatal("the bundle that came back is not served")
	}
}

// TestClientCAConfigConcurrentHandshakes checks (under -race) that
// handshakes may ask for their Config while another one reloads the
// bundle, and that each gets the settings with a bundle's pool.
func TestClientCAConfigConcurrentHandshakes(t *testing.T) {
	pki := newTestPKI(t)
	certFile, keyFile := filepath.Join(pki.dir, "tls.crt"), filepath.Join(pki.dir, "tls.key")
	pki.issue(t, certFile, keyFile, 1)
	cas := []*testPKI{newNamedTestPKI(t, "client CA 1"), newNamedTestPKI(t, "client CA 2")}
	bundle := filepath.Join(t.TempDir(), "client-ca.pem")
	writeBundle(t, bundle, cas[0])
	log := slog.New(slog.NewTextHandler(&lockedBuffer{}, nil))
	certs, err := newCertReloader(certFile, keyFile, log)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs, err := newClientCAReloader(bundle, log)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs.interval = 0 // every handshake checks the file
	clientCAs.nextCheck.Store(0)
	config := serverTLSConfig(certs, clientCAs)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				c, err := config.GetConfigForClient(nil)
				if err != nil || c == nil || c.ClientCAs == nil || c.ClientAuth != tls.RequireAndVerifyClientCert || len(c.NextProtos) != 2 {
					t.Errorf("GetConfigForClient: %v, %v", c, err)
					return
				}
			}
		}()
	}
	for i := range 6 {
		writeBundle(t, bundle, cas[i%2])
	}
	wg.Wait()
	c, _ := config.GetConfigForClient(nil)
	if !c.ClientCAs.Equal(cas[1].pool) {
		t.Fatal("the last bundle written is not the one served")
	}
}
