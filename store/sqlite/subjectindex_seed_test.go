package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// TestSubjectIndexWritesOnSeed measures what the subject index costs the
// reserves over a large store, the entries written behind (schema 12)
// against the automatic index of schema 11 (created on a second copy), in
// bytes the process writes (WAL frames and the checkpointer's copies, from
// /proc/self/io: not sensitive to load) and CPU per reserve, the flush
// counted (of CAPLEDGER_SUBJECT_BATCHES batches of 64, default 625).
// CAPLEDGER_SUBJECT_SEED names a schema-12 capledger.db (a copy
// of the 1M store migrated); it is copied, never written.
//
//	CAPLEDGER_SUBJECT_SEED=/work/seed1m-subjidx/capledger.db go test -run TestSubjectIndexWritesOnSeed -v ./store/sqlite
func TestSubjectIndexWritesOnSeed(t *testing.T) {
	seed := os.Getenv("CAPLEDGER_SUBJECT_SEED")
	if seed == "" {
		t.Skip("CAPLEDGER_SUBJECT_SEED is not set")
	}
	const perBatch, subjects = 64, 1_000_000
	batches := 625 // 40,000 reserves: 10 s of entries at 4,000 reserves/s
	if v, err := strconv.Atoi(os.Getenv("CAPLEDGER_SUBJECT_BATCHES")); err == nil {
		batches = v
	}
	ctx := context.Background()
	for _, variant := range []string{"write-behind", "automatic index"} {
		path := filepath.Join(t.TempDir(), "capledger.db")
		copyFile(t, seed, path)
		if variant == "automatic index" {
			db, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("CREATE INDEX reservations_by_subject ON reservations (subject, created_at, id)"); err != nil {
				t.Fatal(err)
			}
			db.Close()
		}
		s, err := sqlite.Open(ctx, path, sqlite.WithSubjectIndexFlush(time.Hour, 1<<30))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		run := func(n int) {
			for b := range n {
				c := &store.Changes{NewReservations: map[string]bool{}}
				for i := range perBatch {
					r := reservation(fmt.Sprintf("seed-%d-%d-%d", rng.Uint64(), b, i))
					r.Account.Subject = "bench-" + strconv.Itoa(rng.IntN(subjects))
					r.CreatedAt = time.Now()
					c.Reservations = append(c.Reservations, r)
					c.NewReservations[r.ID] = true
					c.Journal = append(c.Journal, ledger.JournalEntry{At: r.CreatedAt, Kind: ledger.KindReserve, Account: r.Account,
						ReservationID: r.ID, From: ledger.StateRequested, To: ledger.StateReserved})
				}
				commit(t, s, c)
			}
		}
		run(20) // warm the writer's cache
		time.Sleep(300 * time.Millisecond)
		w0, cpu0, t0 := writtenBytes(t), cpuTime(), time.Now()
		run(batches)
		commitCPU, commitBytes := cpuTime()-cpu0, writtenBytes(t)-w0
		if variant == "write-behind" {
			if err := s.FlushSubjectIndex(ctx); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(300 * time.Millisecond) // the checkpointer copies what was written
		n := float64(batches * perBatch)
		t.Logf("%s, %d reserves: %.0f bytes written per reserve (commits alone %.0f), CPU %.1f µs per reserve (commits alone %.1f), %s",
			variant, batches*perBatch, float64(writtenBytes(t)-w0)/n, float64(commitBytes)/n,
			float64((cpuTime()-cpu0).Microseconds())/n, float64(commitCPU.Microseconds())/n, time.Since(t0).Round(time.Millisecond))
		s.Close()
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// writtenBytes is /proc/self/io's wchar: bytes passed to write calls.
func writtenBytes(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/io")
	if err != nil {
		t.Skip("needs /proc/self/io")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "wchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no wchar in /proc/self/io")
	return 0
}
