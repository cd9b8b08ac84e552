package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/replicatest"
)

// TestFrozenReplicaMidTransaction: of two replicas serving one subject at
// its capacity edge, one is frozen (SIGSTOP: a long GC or VM pause, a
// stuck host) while it holds an open transaction with row locks. The
// other must go on acknowledging once idle_in_transaction_session_timeout
// (shortened to 2 s here through the DSN; 30 s by default) ends the
// frozen session and frees its locks; it takes the worker lease over.
// When the frozen one resumes, its cut-off transaction and whatever it
// believed about the lease must not corrupt anything: it serves again, no
// unit was admitted beyond capacity, every acknowledged reservation and
// settle is stored, the audit is clean, and lost reserves retried by id
// debit once.
func TestFrozenReplicaMidTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two server processes")
	}
	var random [4]byte
	rand.Read(random[:])
	base := schemaDSN(t)
	dsnFor := func(name string) (string, string) {
		app := "capledger_freeze_" + name + "_" + hex.EncodeToString(random[:])
		return withParam(t, withParam(t, base, "application_name", app), "idle_in_transaction_session_timeout", "2s"), app
	}
	dsnA, appA := dsnFor("a")
	dsnB, _ := dsnFor("b")
	bin := replicatest.BuildCapledger(t)
	replicas := []*replicatest.Replica{replicatest.StartReplica(t, bin, dsnA, "--lease-ttl", "1s"), replicatest.StartReplica(t, bin, dsnB, "--lease-ttl", "1s")}
	const capacity = 8_000
	publishPolicy(t, replicas[0].Addr, capacity, capacity)

	var clients []*client.Client
	for _, r := range replicas {
		c, err := client.New(r.Addr, client.WithTimeout(3*time.Second),
			client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 4, BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	l := newGatewayLoad()
	var answered [2]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for gw := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.gateway(t, fmt.Sprintf("rl-f%d", gw), uint64(gw), 0, stop, clients[gw%2:gw%2+1], &answered[gw%2])
		}()
	}
	stopLoad := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopLoad()
	waitFor := func(what string, within time.Duration, cond func() bool) bool {
		for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("%s: not within %s", what, within)
				return false
			}
		}
		return true
	}
	if !waitFor("80 answers before the freeze", time.Minute, func() bool { return answered[0].Load()+answered[1].Load() >= 80 }) {
		t.FailNow()
	}

	// Freeze replica A at a moment one of its sessions holds a
	// transaction that locked or wrote rows of accounts (the subject's one
	// account: every reserve and settle of B waits for it), checked after
	// the stop.
	admin, err := pgx.Connect(context.Background(), serverDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	frozen := replicas[0]
	inTransaction := func() bool {
		var n int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity a
			JOIN pg_locks l ON l.pid = a.pid AND l.mode IN ('RowShareLock', 'RowExclusiveLock')
			JOIN pg_class c ON c.oid = l.relation AND c.relname = 'accounts'
			WHERE a.application_name = $1 AND a.backend_xid IS NOT NULL`, appA).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	caught := false
	for try := 0; try < 200 && !caught; try++ {
		frozen.Signal(syscall.SIGSTOP)
		if caught = inTransaction(); !caught {
			frozen.Signal(syscall.SIGCONT)
			time.Sleep(time.Duration(try%7) * time.Millisecond)
		}
	}
	if !caught {
		frozen.Signal(syscall.SIGCONT)
		t.Fatal("replica A was never caught inside a transaction")
	}
	frozenAt := time.Now()
	defer frozen.Signal(syscall.SIGCONT)

	// B answers again (acknowledges, or rejects once the subject is full)
	// when the frozen session is ended (2 s), with room for a loaded
	// machine.
	base0 := answered[1].Load()
	waitFor("replica B answering while A is frozen", 8*time.Second, func() bool { return answered[1].Load() >= base0+10 })
	waitFor("the frozen session ended", 8*time.Second, func() bool { return !inTransaction() })
	frozenFor := time.Since(frozenAt)
	frozen.Signal(syscall.SIGCONT)

	// The resumed replica serves again.
	resumed := answered[0].Load()
	waitFor("replica A answering after it resumed", 20*time.Second, func() bool { return answered[0].Load() >= resumed+10 })
	stopLoad()
	for _, c := range clients {
		c.Close() // no resends behind the checks
	}
	if t.Failed() {
		t.FailNow()
	}
	fresh := stillServing(t, replicas)
	l.check(t, dsnB, capacity, fresh[1])
	t.Logf("A frozen for %s; answered by A %d, by B %d; %s", frozenFor.Round(time.Millisecond), answered[0].Load(), answered[1].Load(), l)
}
