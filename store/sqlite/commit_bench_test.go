package sqlite

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// BenchmarkCommitLifecycles measures the engine's group commit at the
// store: per transaction what engine.Core does (Begin, the reservation
// and account prefetches, the reads, one Write, a durable Commit) for
//
//   - singles64: 64 single-reservation commands, a third each reserves,
//     starts and settles (of reservations reserved and started by the
//     transactions before), each reserve on an account drawn at random
//     (a reserve and a settle read and write their account, a start only
//     the reservation, as in the ledger);
//   - batch100: one 100-reservation batch command per transaction,
//     reserving, then starting, then settling 100 reservations of accounts
//     drawn at random, in turn.
//
// Each runs over 10 accounts and over every account of a file holding
// CAPLEDGER_BENCH_ACCOUNTS (default 100,000) with the default row cache,
// so the difference is the page spread only. It reports CPU time (user
// and system, of the whole process, the checkpointer included) per
// lifecycle (three commands), the WAL frames (pages) each transaction
// appends, read from the WAL index, and the read system calls of the
// process per transaction: the pages the writer's cache missed and the
// WAL frames the checkpointer copied into the file.
//
// With CAPLEDGER_BENCH_PAGES set it also logs, from three more
// transactions, the pages written per b-tree.
//
// The filled file is built once per binary and account count; with
// CAPLEDGER_BENCH_CACHE set it is kept in that directory between runs.
//
//	CAPLEDGER_BENCH_ACCOUNTS=1000000 CAPLEDGER_BENCH_CACHE=/tmp/capledger-bench \
//	  go test -run '^$' -bench CommitLifecycles -benchtime 300x ./store/sqlite
func BenchmarkCommitLifecycles(b *testing.B) {
	accounts := benchEnvInt(b, "CAPLEDGER_BENCH_ACCOUNTS", 100_000)
	template := lifecycleTemplate(b, accounts)
	for _, shape := range []string{"singles64", "batch100"} {
		for _, over := range []int{10, accounts} {
			b.Run(fmt.Sprintf("%s/accounts=%d", shape, over), func(b *testing.B) {
				path := filepath.Join(b.TempDir(), "capledger.db")
				copyFile(b, template, path)
				s, err := Open(context.Background(), path)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				l := &lifecycles{s: s, over: over, rng: rand.New(rand.NewPCG(1, uint64(over))), now: t0Bench}
				shm, err := os.Open(path + "-shm")
				if err != nil {
					b.Fatal(err)
				}
				defer shm.Close()
				step := l.singles
				if shape == "batch100" {
					step = l.batch
				}
				for range 6 { // fill the queues: the measured transactions run in steady state
					step(b)
				}
				var frames, txs int64
				reads := readSyscalls(b)
				cpu := benchCPU()
				b.ResetTimer()
				for range b.N {
					before := walFrames(b, shm)
					n := step(b)
					after := walFrames(b, shm)
					if after < before { // the WAL restarted from its beginning
						before = 0
					}
					frames += int64(after - before)
					txs++
					l.lifecycles += float64(n) / 3
				}
				b.StopTimer()
				b.ReportMetric(float64((benchCPU()-cpu).Microseconds())/l.lifecycles, "cpu-µs/lifecycle")
				b.ReportMetric(float64(frames)/float64(txs), "wal-pages/tx")
				b.ReportMetric(float64(readSyscalls(b)-reads)/float64(txs), "reads/tx")
				if os.Getenv("CAPLEDGER_BENCH_PAGES") != "" {
					b.Logf("WAL pages per transaction by b-tree: %s", pagesByTree(b, path, step, 3))
				}
			})
		}
	}
}

var t0Bench = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func benchAccount(i int) ledger.AccountKey {
	return ledger.AccountKey{Subject: "tenant-" + strconv.Itoa(i), Route: "chat.generate", Region: "eu", Generation: 1}
}

// lifecycleTemplate returns a file holding accounts accounts (and their
// current rows), each with one dimension of ample capacity.
func lifecycleTemplate(b *testing.B, accounts int) string {
	ms, err := migrations()
	if err != nil {
		b.Fatal(err)
	}
	dir := os.Getenv("CAPLEDGER_BENCH_CACHE")
	if dir == "" {
		dir = b.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("lifecycles-%d-v%d.db", accounts, ms[len(ms)-1].Version))
	if _, err := os.Stat(path); err == nil {
		return path
	}
	ctx := context.Background()
	tmp := path + ".filling"
	os.Remove(tmp)
	s, err := Open(ctx, tmp)
	if err != nil {
		b.Fatal(err)
	}
	const chunk = 10_000
	for from := 0; from < accounts; from += chunk {
		c := &store.Changes{}
		for i := from; i < min(from+chunk, accounts); i++ {
			key := benchAccount(i)
			c.Accounts = append(c.Accounts, ledger.Account{Key: key, Dims: 1, EpochStart: t0Bench,
				Balances: ledger.Balances{{Opening: 1 << 50, Available: 1 << 50}}, Version: 1})
			c.Currents = append(c.Currents, store.Current{Subject: key.SubjectKey(), Generation: 1})
		}
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.Write(ctx, c); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		b.Fatal(err)
	}
	os.Rename(tmp+"-wal", path+"-wal")
	return path
}

// lifecycles is the state of BenchmarkCommitLifecycles: the reservations
// reserved and not started, and started and not settled, in order.
type lifecycles struct {
	s          *Store
	over       int
	rng        *rand.Rand
	now        time.Time
	seq        int
	reserved   []string
	started    []string
	lifecycles float64
}

// command is one step of a reservation's lifecycle.
type command struct {
	kind ledger.Kind
	id   string
}

// singles commits 64 single-reservation commands and returns 64.
func (l *lifecycles) singles(b *testing.B) int {
	cmds := make([]command, 0, 64)
	for k := range 64 {
		switch {
		case k%3 == 1 && len(l.reserved) > 0:
			cmds = append(cmds, command{ledger.KindStart, l.reserved[0]})
			l.reserved = l.reserved[1:]
		case k%3 == 2 && len(l.started) > 0:
			cmds = append(cmds, command{ledger.KindSettle, l.started[0]})
			l.started = l.started[1:]
		default:
			cmds = append(cmds, command{kind: ledger.KindReserve})
		}
	}
	l.commit(b, cmds)
	return len(cmds)
}

// batch commits one 100-reservation command: reserves, starts or settles
// in turn. It returns 100.
func (l *lifecycles) batch(b *testing.B) int {
	cmds := make([]command, 100)
	switch {
	case len(l.started) >= 100:
		for i := range cmds {
			cmds[i] = command{ledger.KindSettle, l.started[i]}
		}
		l.started = l.started[100:]
	case len(l.reserved) >= 100:
		for i := range cmds {
			cmds[i] = command{ledger.KindStart, l.reserved[i]}
		}
		l.reserved = l.reserved[100:]
	default:
		for i := range cmds {
			cmds[i] = command{kind: ledger.KindReserve}
		}
	}
	l.commit(b, cmds)
	return len(cmds)
}

// commit runs cmds in one transaction as engine.Core would: prefetch,
// read every row a command needs, write what changed, commit durably.
func (l *lifecycles) commit(b *testing.B, cmds []command) {
	ctx := context.Background()
	l.now = l.now.Add(time.Millisecond)
	stx, err := l.s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer stx.Rollback(ctx)
	tx := stx.(*Tx)
	var ids []string
	var subjects []ledger.PolicyKey
	keys := make([]ledger.AccountKey, len(cmds))
	for i := range cmds {
		if cmds[i].kind == ledger.KindReserve {
			l.seq++
			cmds[i].id = fmt.Sprintf("rl-%012d", l.seq)
			keys[i] = benchAccount(l.rng.IntN(l.over))
			subjects = append(subjects, keys[i].SubjectKey())
		}
		ids = append(ids, cmds[i].id)
	}
	if err := tx.ReservationsPrefetch(ctx, ids); err != nil {
		b.Fatal(err)
	}
	if err := tx.AccountsPrefetch(ctx, subjects, nil, nil); err != nil {
		b.Fatal(err)
	}
	c := &store.Changes{NewReservations: map[string]bool{}}
	accounts := map[ledger.AccountKey]int{}
	account := func(key ledger.AccountKey) *ledger.Account {
		if i, ok := accounts[key]; ok {
			return &c.Accounts[i]
		}
		if _, err := tx.AccountCurrentGet(ctx, key.SubjectKey()); err != nil {
			b.Fatal(err)
		}
		a, err := tx.AccountGet(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		accounts[key] = len(c.Accounts)
		c.Accounts = append(c.Accounts, *a)
		return &c.Accounts[len(c.Accounts)-1]
	}
	for i, cmd := range cmds {
		var r ledger.Reservation
		delta := ledger.Balances{}
		from := ledger.StateRequested
		switch cmd.kind {
		case ledger.KindReserve:
			// A reserve looks for its id, as a reservation and as a
			// retired one (prefetched, like every command's id).
			id := cmd.id
			if _, err := tx.ReservationGet(ctx, id); !errors.Is(err, store.ErrNotFound) {
				b.Fatalf("reservation %s: %v, want not found", id, err)
			}
			if _, err := tx.TombstoneGet(ctx, id); !errors.Is(err, store.ErrNotFound) {
				b.Fatalf("tombstone %s: %v, want not found", id, err)
			}
			r = ledger.Reservation{ID: id, RequestDigest: "sha256:" + id, Account: keys[i], AccountingEpoch: t0Bench,
				Reserved: ledger.Amounts{600}, State: ledger.StateReserved, CreatedAt: l.now, ExpiresAt: l.now.Add(time.Hour)}
			c.NewReservations[id] = true
			delta[0] = ledger.Balance{Available: -600, Reserved: 600}
			l.reserved = append(l.reserved, id)
		default:
			got, err := tx.ReservationGet(ctx, cmd.id)
			if err != nil {
				b.Fatal(err)
			}
			r, from = *got, got.State
			if cmd.kind == ledger.KindStart {
				r.State, r.OperationID, r.StartedAt, r.ExecutionDeadline = ledger.StateStarted, "op-"+r.ID, l.now, l.now.Add(10*time.Minute)
				l.started = append(l.started, r.ID)
			} else {
				r.State, r.Actual, r.FinishedAt = ledger.StateSettled, ledger.Amounts{300}, l.now
				delta[0] = ledger.Balance{Reserved: -600, Spent: 300, Available: 300}
			}
		}
		if cmd.kind != ledger.KindStart { // a start changes the reservation only
			a := account(r.Account)
			a.Balances[0].Available += delta[0].Available
			a.Balances[0].Reserved += delta[0].Reserved
			a.Balances[0].Spent += delta[0].Spent
			a.Version++
		}
		c.Reservations = append(c.Reservations, r)
		c.Journal = append(c.Journal, ledger.JournalEntry{At: l.now, Kind: cmd.kind, Account: r.Account, ReservationID: r.ID,
			From: from, To: r.State, Delta: delta})
	}
	if err := tx.Write(ctx, c); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}

// pagesByTree runs step txs times, each after emptying the WAL, and
// returns the pages their WAL frames hold per b-tree (as dbstat names
// them; "-" for pages no b-tree holds, such as the file header's and
// free pages), per transaction.
func pagesByTree(b *testing.B, path string, step func(*testing.B) int, txs int) string {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var pageSize int
	if err := db.QueryRow("PRAGMA page_size").Scan(&pageSize); err != nil {
		b.Fatal(err)
	}
	written := map[uint32]int{}
	for range txs {
		for busy := 1; busy != 0; {
			var log, done int
			if err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &log, &done); err != nil {
				b.Fatal(err)
			}
			if busy != 0 {
				time.Sleep(10 * time.Millisecond) // the store's checkpointer runs one
			}
		}
		step(b)
		wal, err := os.ReadFile(path + "-wal")
		if err != nil {
			b.Fatal(err)
		}
		seen := map[uint32]bool{}
		for off := 32; off+24+pageSize <= len(wal); off += 24 + pageSize {
			if p := binary.BigEndian.Uint32(wal[off:]); !seen[p] {
				seen[p] = true
				written[p]++
			}
		}
	}
	rows, err := db.Query("SELECT pageno, name FROM dbstat")
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	tree := map[uint32]string{}
	for rows.Next() {
		var p uint32
		var name string
		if err := rows.Scan(&p, &name); err != nil {
			b.Fatal(err)
		}
		tree[p] = name
	}
	byTree := map[string]int{}
	for p, n := range written {
		name := tree[p]
		if name == "" {
			name = "-"
		}
		byTree[name] += n
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(byTree)) {
		out = append(out, fmt.Sprintf("%s %.1f", name, float64(byTree[name])/float64(txs)))
	}
	return strings.Join(out, ", ")
}

// walFrames returns mxFrame of the WAL index header (the first copy, at
// offset 16 of the -shm file, in native byte order): the frames of the
// WAL that hold committed pages.
func walFrames(b *testing.B, shm *os.File) uint32 {
	var buf [4]byte
	if _, err := shm.ReadAt(buf[:], 16); err != nil {
		b.Fatal(err)
	}
	return binary.NativeEndian.Uint32(buf[:])
}

func copyFile(b *testing.B, from, to string) {
	for _, suffix := range []string{"", "-wal"} {
		in, err := os.Open(from + suffix)
		if os.IsNotExist(err) && suffix != "" {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		out, err := os.Create(to + suffix)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			b.Fatal(err)
		}
		in.Close()
		if err := out.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// readSyscalls returns the read system calls the process has made
// (/proc/self/io's syscr): SQLite reads a page with one, the writer a page
// its cache misses, the checkpointer each WAL frame it copies.
func readSyscalls(b *testing.B) int64 {
	io, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(io), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// benchCPU returns the CPU time (user and system) the process has used.
func benchCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
