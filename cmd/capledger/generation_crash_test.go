package main

import (
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestGenerationSwitchUnderLoadThenKill publishes a new policy generation
// while gateways reserve, start and settle under the old one, then kills
// `capledger serve` with SIGKILL mid-load. After the restart everything
// acknowledged is stored and the audit is clean (every move between the
// generations recorded at both ends, once); then every reservation left
// running or held, under either generation, is settled or released: each
// subject's accounts, all generations together, hold nothing reserved
// and have spent exactly the usage the settled reservations carry, the
// late refunds on generation 1 moved on to generation 2 (nothing left
// available there), and the audit is still clean.
func TestGenerationSwitchUnderLoadThenKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two server processes")
	}
	bin := buildBinary(t)
	dataDir := t.TempDir()
	srv := startServer(t, bin, dataDir)
	stop, done := load(t, srv.url, 150)
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"chat","holdTtl":"3600s",
	  "dimensions":[{"unit":"tokens","burst":"200000000","refillUnits":"1000","refillInterval":"1s"},
	                {"unit":"requests","burst":"1000000"}]}}`)
	// A larger burst: generation 2 has room for all of generation 1's
	// capacity. More load under it, then the kill.
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for countGen2(t, client, srv.url) < 20 {
		if time.Now().After(deadline) {
			t.Fatal("fewer than 20 reservations of tenant-0 under generation 2 within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Wait()
	stop()
	records := done()

	srv = startServer(t, bin, dataDir)
	verify(t, srv.url, records)

	// Drain: settle what runs, release what is held, under whichever
	// generation admitted it.
	spent := map[string]int64{}
	for _, r := range records {
		status, body := post(client, srv.url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, r.id))
		if status != 200 {
			t.Fatalf("get %s: %d %v", r.id, status, body)
		}
		res := body["reservation"].(map[string]any)
		switch res["state"] {
		case "RESERVATION_STATE_RESERVED":
			mustPost(t, srv.url, "Release", fmt.Sprintf(`{"reservationId":%q}`, r.id))
		case "RESERVATION_STATE_STARTED":
			mustPost(t, srv.url, "Settle", fmt.Sprintf(
				`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d,"requests":1}}`, r.id, r.id, r.actual))
			spent[r.subject] += r.actual
		case "RESERVATION_STATE_SETTLED":
			spent[r.subject] += r.actual
		default:
			t.Fatalf("%s is %v", r.id, res["state"])
		}
	}
	for subject, want := range spent {
		out := mustPost(t, srv.url, "GetAccount", fmt.Sprintf(`{"subject":%q,"route":"chat"}`, subject))
		var reserved, got int64
		generations := 0
		for _, a := range out["accounts"].([]any) {
			generations++
			acc := a.(map[string]any)
			for _, b := range acc["balances"].([]any) {
				bal := b.(map[string]any)
				n := func(k string) int64 { v, _ := strconv.ParseInt(fmt.Sprint(bal[k]), 10, 64); return v }
				if bal["unit"] == "tokens" {
					reserved, got = reserved+n("reserved"), got+n("spent")
				}
				// Generation 2 has room for all of generation 1's
				// capacity: the switch moves it, and a late refund on
				// generation 1 moves on too (once, by its receipt).
				if fmt.Sprint(acc["policyGeneration"]) == "1" && n("available") != 0 {
					t.Errorf("%s: generation 1 still has %d %s available after the drain", subject, n("available"), bal["unit"])
				}
			}
		}
		if generations < 2 || reserved != 0 || got != want {
			t.Errorf("%s: %d generations, reserved %d spent %d; want 2 generations, 0 reserved, %d spent (the settled usage)",
				subject, generations, reserved, got, want)
		}
	}
	if status, audit := post(client, srv.url, "Audit", `{}`); status != 200 || audit["discrepancies"] != nil {
		t.Fatalf("audit after the drain: %d %v", status, audit)
	}
	stopGracefully(t, srv)
}

// countGen2 returns how many reservations of tenant-0 generation 2 holds
// (reserved, or started and settled) as its account's reserved + spent
// requests.
func countGen2(t *testing.T, client *http.Client, url string) int64 {
	status, out := post(client, url, "GetAccount", `{"subject":"tenant-0","route":"chat"}`)
	if status != 200 {
		t.Fatalf("account: %d %v", status, out)
	}
	var n int64
	for _, a := range out["accounts"].([]any) {
		acc := a.(map[string]any)
		if fmt.Sprint(acc["policyGeneration"]) != "2" {
			continue
		}
		for _, b := range acc["balances"].([]any) {
			bal := b.(map[string]any)
			if bal["unit"] == "requests" {
				r, _ := strconv.ParseInt(fmt.Sprint(bal["reserved"]), 10, 64)
				s, _ := strconv.ParseInt(fmt.Sprint(bal["spent"]), 10, 64)
				n += r + s
			}
		}
	}
	return n
}
