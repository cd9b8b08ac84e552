package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSubjectIndexSurvivesKill kills a real `capledger serve` with SIGKILL
// right after acknowledging reserves, before its subject index flusher
// wrote their entries (they were pending in memory), and checks that the
// restarted server lists every acknowledged reservation under its subject:
// Open rebuilt the entries from the journal.
func TestSubjectIndexSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two server processes")
	}
	bin := buildBinary(t)
	dataDir := t.TempDir()
	p := startServer(t, bin, dataDir)
	mustPost(t, p.url, "PublishPolicy", crashPolicy)
	const reserves, subjects = 300, 3
	began := time.Now()
	parallel(reserves, func(i int) {
		postOK(t, p.url, "Reserve", fmt.Sprintf(`{"reservationId":"kill-%03d","subject":"tenant-%d","route":"chat","units":{"tokens":10,"requests":1}}`,
			i, i%subjects))
	})
	if t.Failed() {
		t.FailNow()
	}
	kill9(t, p)
	if took := time.Since(began); took > 5*time.Second {
		t.Logf("the reserves took %s: the flusher (every 10 s) may have run", took)
	}
	db, err := sql.Open("sqlite", filepath.Join(dataDir, "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	var flushed int
	err = db.QueryRow("SELECT count(*) FROM reservation_subjects").Scan(&flushed)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if flushed == reserves {
		t.Fatal("every entry was flushed before the kill: the test proves nothing")
	}
	t.Logf("%d of %d entries in the table at the kill", flushed, reserves)

	p = startServer(t, bin, dataDir)
	for s := range subjects {
		status, out := postConsole(p.url, "ListSubjectReservations", fmt.Sprintf(`{"subject":"tenant-%d","pageSize":1000}`, s))
		if status != 200 {
			t.Fatalf("list tenant-%d: %d %v", s, status, out)
		}
		listed := map[string]bool{}
		items, _ := out["reservations"].([]any)
		for _, it := range items {
			r, _ := it.(map[string]any)
			id, _ := r["reservationId"].(string)
			listed[id] = true
		}
		for i := s; i < reserves; i += subjects {
			if id := fmt.Sprintf("kill-%03d", i); !listed[id] {
				t.Errorf("tenant-%d: acknowledged %s is not listed after the restart (%d listed)", s, id, len(listed))
			}
		}
	}
}

// postConsole sends one JSON call to the ConsoleService; status 0: no
// answer.
func postConsole(url, method, body string) (int, map[string]any) {
	resp, err := crashClient.Post(url+"/capledger.v1.ConsoleService/"+method, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	if json.NewDecoder(resp.Body).Decode(&out) != nil {
		return 0, nil
	}
	return resp.StatusCode, out
}
