package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestContractDeadlinePassedBeforeTheMethod: a Connect deadline that
// passes before the method runs, here Connect-Timeout-Ms 1 with the body
// sent 50 ms after the headers (as a slow or loaded network, or a busy
// server, does for a deadline of a few milliseconds), is answered as
// docs/API.md says of Connect-Timeout-Ms 0: 504 with the body
// {"code":"deadline_exceeded","message":"context deadline exceeded"} and
// no detail, nothing applied, and not counted in capledger_commands_total.
func TestContractDeadlinePassedBeforeTheMethod(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	if a := contractCall(t, srv.url, http.MethodPost, "PublishPolicy", []byte(`{"policy":{"subject":"tenant-7","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":1000,"refillUnits":10,"refillInterval":"1s"}]}}`), nil); a.status != http.StatusOK {
		t.Fatalf("publish: %d %s", a.status, a.raw)
	}
	const unavailable = `capledger_commands_total{kind="reserve",outcome="unavailable"}`
	countedBefore := metricValue(t, srv.url, unavailable)

	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"reservationId":"late","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`
	if _, err := fmt.Fprintf(conn, "POST /capledger.v1.LedgerService/Reserve HTTP/1.1\r\nHost: capledger\r\n"+
		"Content-Type: application/json\r\nConnect-Timeout-Ms: 1\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the deadline passes while the body is on its way
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var answer map[string]any
	if resp.StatusCode != http.StatusGatewayTimeout || json.Unmarshal(raw, &answer) != nil ||
		len(answer) != 2 || answer["code"] != "deadline_exceeded" || answer["message"] != "context deadline exceeded" {
		t.Fatalf("HTTP %d %s; want 504 {\"code\":\"deadline_exceeded\",\"message\":\"context deadline exceeded\"}, no detail", resp.StatusCode, raw)
	}
	if a := contractCall(t, srv.url, http.MethodPost, "GetReservation", []byte(`{"reservationId":"late"}`), nil); a.status != http.StatusNotFound {
		t.Errorf("the Reserve whose deadline passed before it ran was applied: %d %s", a.status, a.raw)
	}
	if got := metricValue(t, srv.url, unavailable); got != countedBefore {
		t.Errorf("%s went from %v to %v; the answer of a method that never ran is not counted", unavailable, countedBefore, got)
	}
}
