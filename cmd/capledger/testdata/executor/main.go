// Command executor is the job executor the resolver's real-process tests
// run and kill -9: it runs jobs under reservations with client.Run,
// records its operations durably (client.FileOperationStore) and serves
// them (client.OperationStatusHandler), and keeps a durable job log, so
// that after a crash it finishes the jobs it was running and records
// their usage for the ledger's resolver to settle.
//
// It prints one line per job once the job is durable, "job RES OP TOKENS",
// and one per job a later run recovered, "recovered RES OP TOKENS": a kill
// between the log entry and the "job" line leaves only the second, so the
// tests take both as the truth of what was used.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capledger/capledger/client"
)

// job is one entry of the durable job log.
type job struct {
	ReservationID string    `json:"reservationId"`
	OperationID   string    `json:"operationId"`
	Tokens        int64     `json:"tokens"`
	EndsAt        time.Time `json:"endsAt"`
}

var stdout sync.Mutex

func say(format string, args ...any) {
	stdout.Lock()
	defer stdout.Unlock()
	fmt.Printf(format+"\n", args...)
}

// tokensOf is what a job uses: 100 to 499 tokens, from its operation id.
func tokensOf(op string) int64 {
	sum := sha256.Sum256([]byte(op))
	return 100 + int64(binary.BigEndian.Uint64(sum[:8])%400)
}

func writeJob(dir string, j job) error {
	raw, _ := json.Marshal(j)
	tmp := filepath.Join(dir, ".tmp-"+j.OperationID)
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	return os.Rename(tmp, filepath.Join(dir, j.OperationID+".json"))
}

// hangingStore hangs forever on the Put that records the hangAt-th
// operation as running: the process then holds a started reservation
// whose work it never calls, until it is killed.
type hangingStore struct {
	client.OperationStore
	hangAt  int64
	running atomic.Int64
}

func (h *hangingStore) Put(ctx context.Context, rec client.OperationRecord) error {
	if rec.Status == client.OperationRunning && h.hangAt > 0 && h.running.Add(1) == h.hangAt {
		say("hang %s %s", rec.ReservationID, rec.OperationID)
		select {}
	}
	return h.OperationStore.Put(ctx, rec)
}

func main() {
	ledger := flag.String("ledger", "", "ledger address")
	listen := flag.String("listen", "127.0.0.1:0", "operation-status endpoint address")
	dir := flag.String("dir", "", "state directory (operations and job log)")
	secretFile := flag.String("secret-file", "", "the route's shared secret")
	route := flag.String("route", "jobs.run", "policy route")
	subject := flag.String("subject", "tenant-1", "subject")
	workers := flag.Int("workers", 0, "jobs run at once (0: only recover and serve)")
	duration := flag.Duration("job-duration", time.Second, "how long a job runs")
	hangAt := flag.Int64("hang-at", 0, "hang before calling the work of the N-th job (0: never)")
	flag.Parse()
	log.SetFlags(0)

	secret, err := os.ReadFile(*secretFile)
	if err != nil {
		log.Fatal(err)
	}
	jobsDir := filepath.Join(*dir, "jobs")
	if err := os.MkdirAll(jobsDir, 0o700); err != nil {
		log.Fatal(err)
	}
	ops, err := client.OpenOperationStore(filepath.Join(*dir, "ops"))
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/operations/", client.OperationStatusHandler(ops, []byte(strings.TrimSpace(string(secret)))))
	go http.Serve(ln, mux)
	say("listening %s", ln.Addr())

	// Recovery: jobs the previous process was running finish when their
	// log says, and their usage is recorded for the resolver. A running
	// operation without a log entry never got to do anything.
	ctx := context.Background()
	unknown, err := ops.Unknown()
	if err != nil {
		log.Fatal(err)
	}
	var recovering sync.WaitGroup
	for _, rec := range unknown {
		recovering.Add(1)
		go func() {
			defer recovering.Done()
			var j job
			raw, err := os.ReadFile(filepath.Join(jobsDir, rec.OperationID+".json"))
			switch {
			case errors.Is(err, os.ErrNotExist):
				j = job{ReservationID: rec.ReservationID, OperationID: rec.OperationID}
			case err != nil:
				log.Fatal(err)
			default:
				if err := json.Unmarshal(raw, &j); err != nil {
					log.Fatal(err)
				}
			}
			time.Sleep(time.Until(j.EndsAt))
			if err := client.Finish(ctx, ops, rec.ReservationID, rec.OperationID, client.Units{"tokens": j.Tokens, "requests": 1}); err != nil {
				log.Fatal(err)
			}
			say("recovered %s %s %d", rec.ReservationID, rec.OperationID, j.Tokens)
		}()
	}
	recovering.Wait()
	say("recovery done %d", len(unknown))
	if *workers == 0 {
		select {}
	}

	c, err := client.New(*ledger, client.WithOperationStore(&hangingStore{OperationStore: ops, hangAt: *hangAt}), client.WithTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	for range *workers {
		go func() {
			for {
				_, err := c.Run(ctx, client.ReserveRequest{Subject: *subject, Route: *route, Units: client.Units{"tokens": 500, "requests": 1}, EstimatorDigest: "sha256:jobs"},
					func(ctx context.Context) (client.Units, error) {
						receipt, _ := client.ReceiptFrom(ctx)
						j := job{ReservationID: receipt.ReservationID, OperationID: receipt.OperationID, Tokens: tokensOf(receipt.OperationID), EndsAt: time.Now().Add(*duration)}
						if err := writeJob(jobsDir, j); err != nil {
							return nil, fmt.Errorf("job log: %w: %w", err, client.ErrUsageUnknown)
						}
						say("job %s %s %d", j.ReservationID, j.OperationID, j.Tokens)
						time.Sleep(*duration)
						return client.Units{"tokens": j.Tokens, "requests": 1}, nil
					})
				if err != nil {
					say("run error %v", err)
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	select {}
}
