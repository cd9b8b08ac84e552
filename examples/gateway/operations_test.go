package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

// TestGatewayServesItsOperationsAcrossRestarts: the gateway records each
// request's operation durably and answers the resolver's signed question
// from the record, also from a new process's store over the same
// directory.
func TestGatewayServesItsOperationsAcrossRestarts(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, engine.Options{Logger: quiet})
	ledgerLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ledgerSrv := server.HTTPServer(server.New(eng, server.Config{Logger: quiet}).Handler(), quiet)
	go ledgerSrv.Serve(ledgerLn)
	t.Cleanup(func() { ledgerSrv.Close(); eng.Close(); st.Close() })

	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte("the-chat-route-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ops, secret, err := openOperations(filepath.Join(dir, "ops"), secretFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(ledgerLn.Addr().String(), client.WithOperationStore(ops))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, p := range demoPolicies() {
		if _, _, err := c.PublishPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	backendLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backendSrv := &http.Server{Handler: newFakeLLM(4, time.Microsecond, 1)}
	go backendSrv.Serve(backendLn)
	t.Cleanup(func() { backendSrv.Close() })
	handler, _, err := newGateway(c, &url.URL{Scheme: "http", Host: backendLn.Addr().String()}, 4)
	if err != nil {
		t.Fatal(err)
	}
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gwSrv := &http.Server{Handler: withOperations(handler, ops, secret)}
	go gwSrv.Serve(gwLn)
	t.Cleanup(func() { gwSrv.Close() })
	base := "http://" + gwLn.Addr().String()

	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"hello there"}],"max_tokens":50}`))
	req.Header.Set("Authorization", "Bearer key-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reservationID := resp.Header.Get(client.ReservationHeader)
	if resp.StatusCode != 200 || reservationID == "" {
		t.Fatalf("chat: %d, reservation %q", resp.StatusCode, reservationID)
	}
	settled, err := c.GetReservation(ctx, reservationID)
	if err != nil {
		t.Fatal(err)
	}
	status := &opstatus.Client{Base: base, Secret: secret}
	got, err := status.Get(ctx, reservationID, settled.GetOperationId())
	if err != nil || got.Status != opstatus.StatusFinished || got.Units["tokens"] != settled.GetActualUnits()["tokens"] {
		t.Fatalf("operation status: %+v %v, want finished with the settled %d tokens", got, err, settled.GetActualUnits()["tokens"])
	}
	// A new process over the same directory answers the same.
	ops2, _, err := openOperations(filepath.Join(dir, "ops"), secretFile)
	if err != nil {
		t.Fatal(err)
	}
	again := httptestServer(t, withOperations(http.NotFoundHandler(), ops2, secret))
	if got, err := (&opstatus.Client{Base: again, Secret: secret}).Get(ctx, reservationID, settled.GetOperationId()); err != nil || got.Status != opstatus.StatusFinished {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
}

func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}
