// failoverload: the client used to check OPERATIONS.md's "Failover with
// pg_auto_failover" by hand. Workers reserve 1 token each with unique ids
// ("PREFIX-wW-N") over the JSON API, repeating an id that got no answer or
// a 503/504/499 with the same id until it is acknowledged. Every
// acknowledged id goes to PREFIX.acked (request start time, id, attempts,
// replayed); every other answer to PREFIX.errors (status, Retry-After,
// body), so the gap's answers can be compared with API.md. Stop it with
// SIGTERM, then check that every acknowledged id is stored:
//
//	capledger policy publish policy.yaml   # subject "*", route chat, unit tokens, holdTtl 1h
//	go run ./scripts/failoverload -addr http://127.0.0.1:7070 -prefix run1 &
//	pg_autoctl perform failover; kill -9 the primary node's processes; ...
//	kill %1; go run ./scripts/failoverload -addr http://127.0.0.1:7070 verify run1.acked
//
// Gaps in the acknowledgements (sort PREFIX.acked by time) are the
// unavailability per failover.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

var addr = flag.String("addr", "http://127.0.0.1:27070", "")
var workers = flag.Int("workers", 8, "")
var prefix = flag.String("prefix", "run", "")
var token = flag.String("token", "", "bearer token (serve --tokens)")
var hc = &http.Client{Timeout: 4 * time.Second}

func call(method string, body any) (int, http.Header, []byte, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequest("POST", *addr+"/capledger.v1.LedgerService/"+method, bytes.NewReader(b))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if *token != "" {
		req.Header.Set("Authorization", "Bearer "+*token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, out, nil
}

func main() {
	flag.Parse()
	if flag.Arg(0) == "verify" {
		verify(flag.Arg(1))
		return
	}
	acked, _ := os.OpenFile(*prefix+".acked", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0644)
	errs, _ := os.OpenFile(*prefix+".errors", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0644)
	var mu sync.Mutex
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() { <-stop; close(done) }()
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; ; n++ {
				id := fmt.Sprintf("%s-w%d-%d", *prefix, w, n)
				req := map[string]any{"reservationId": id, "subject": fmt.Sprintf("tenant-%d", w%4), "route": "chat", "units": map[string]int{"tokens": 1}}
				for attempt := 0; ; attempt++ {
					select {
					case <-done:
						if attempt > 0 {
							mu.Lock()
							fmt.Fprintf(errs, "%s UNRESOLVED %s\n", time.Now().UTC().Format("15:04:05.000"), id)
							mu.Unlock()
						}
						return
					default:
					}
					t0 := time.Now()
					st, h, body, err := call("Reserve", req)
					ts := t0.UTC().Format("15:04:05.000")
					if err == nil && st == 200 {
						var r struct{ Replayed bool }
						json.Unmarshal(body, &r)
						mu.Lock()
						fmt.Fprintf(acked, "%s %s attempts=%d replayed=%v\n", ts, id, attempt+1, r.Replayed)
						mu.Unlock()
						break
					}
					mu.Lock()
					if err != nil {
						fmt.Fprintf(errs, "%s %s transport %v\n", ts, id, err)
					} else {
						fmt.Fprintf(errs, "%s %s %d retry-after=%q %.300s\n", ts, id, st, h.Get("Retry-After"), strings.TrimSpace(string(body)))
					}
					mu.Unlock()
					if st != 0 && st != 503 && st != 504 && st != 499 {
						// a definite answer other than 200: record and move on
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
		}(w)
	}
	wg.Wait()
}

func verify(file string) {
	f, err := os.Open(file)
	if err != nil {
		panic(err)
	}
	sc := bufio.NewScanner(f)
	n, missing := 0, 0
	for sc.Scan() {
		id := strings.Fields(sc.Text())[1]
		n++
		st, _, body, err := call("GetReservation", map[string]any{"reservationId": id})
		if err != nil || st != 200 || !strings.Contains(string(body), "RESERVED") {
			missing++
			fmt.Printf("MISSING %s: %d %v %.200s\n", id, st, err, body)
		}
	}
	fmt.Printf("verified %d acknowledged ids, %d missing\n", n, missing)
}
