package client

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

// TestTLSAndBearerTokens serves the ledger over TLS (HTTP/2 by ALPN) with
// tokens, and checks every protocol reaches it with WithTLS and
// WithBearerToken, and that a missing or weak token is refused.
func TestTLSAndBearerTokens(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, engine.Options{Logger: quietLogger})
	tokens, err := server.ParseTokens(strings.NewReader("admin-secret-0123456789 admin ops\ngateway-secret-0123456789 gateway gw-1\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(server.New(eng, server.Config{Logger: quietLogger, Tokens: tokens}).Handler())
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted client's handshake
	srv.StartTLS()
	t.Cleanup(func() { srv.Close(); eng.Close(); st.Close() })
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	addr := strings.TrimPrefix(srv.URL, "https://")
	ctx := context.Background()

	// The clients wait for answers however slow (noBreakerWatchdog): a
	// first call's TLS handshake under -race on a loaded machine may take
	// longer than the breaker's 1 s DetectTimeout.
	admin, err := New(addr, noBreakerWatchdog, WithTLS(&tls.Config{RootCAs: roots}), WithBearerToken("admin-secret-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, _, err := admin.PublishPolicy(ctx, &ledgerv1.Policy{Subject: "tenant-7", Route: "chat.generate",
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1000}}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Protocol{ProtocolConnect, ProtocolConnectJSON, ProtocolGRPC} {
		gw, err := New(addr, noBreakerWatchdog, WithProtocol(p), WithTLS(&tls.Config{RootCAs: roots}), WithBearerToken("gateway-secret-0123456789"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gw.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}}); err != nil {
			t.Fatalf("%s over TLS: %v", p, err)
		}
		// The gateway role may not publish.
		if _, _, err := gw.PublishPolicy(ctx, &ledgerv1.Policy{Subject: "x", Route: "y", Dimensions: []*ledgerv1.Dimension{{Unit: "t", Burst: 1}}}); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("%s: gateway publishing: %v, want permission denied", p, err)
		}
		gw.Close()
	}
	anonymous, err := New(addr, noBreakerWatchdog, WithTLS(&tls.Config{RootCAs: roots}))
	if err != nil {
		t.Fatal(err)
	}
	defer anonymous.Close()
	_, err = anonymous.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}})
	var le *LedgerError
	if !errors.As(err, &le) || le.Code != connect.CodeUnauthenticated {
		t.Fatalf("no token: %v, want unauthenticated", err)
	}
	// Without WithTLS the client does not trust the server's certificate.
	var sent atomic.Int64
	untrusted, _ := New("https://"+addr, noBreakerWatchdog, WithHTTPClient(&http.Client{Transport: countingTransport{next: &http.Transport{}, n: &sent}}))
	defer untrusted.Close()
	if _, err := untrusted.GetPolicy(ctx, 1); err == nil {
		t.Fatal("an untrusted certificate was accepted")
	} else if n := sent.Load(); n != 1 {
		t.Fatalf("a certificate failure was tried %d times; a repeat cannot help", n)
	}
}
