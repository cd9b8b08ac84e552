package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/postgres"
)

// cutter relays TCP connections to a replica and can cut all of them at
// once (a load balancer restart, a network blip): the clients see their
// calls fail mid-flight, with unknown outcome.
type cutter struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]bool
	cuts   atomic.Int32
}

func newCutter(t testing.TB, target string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go c.serve()
	t.Cleanup(func() { ln.Close(); c.cut() })
	return c
}

func (c *cutter) serve() {
	for {
		in, err := c.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", c.target)
		if err != nil {
			in.Close()
			continue
		}
		c.mu.Lock()
		c.conns[in], c.conns[out] = true, true
		c.mu.Unlock()
		relay := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					if _, err := dst.Write(buf[:n]); err != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			dst.Close()
			src.Close()
			c.mu.Lock()
			delete(c.conns, dst)
			delete(c.conns, src)
			c.mu.Unlock()
		}
		go relay(out, in)
		go relay(in, out)
	}
}

// cut closes every relayed connection.
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for conn := range c.conns {
		conn.Close()
	}
	c.conns = map[net.Conn]bool{}
	c.cuts.Add(1)
}

func (c *cutter) addr() string { return c.ln.Addr().String() }

// publishPolicy publishes a tokens policy for tenant-7 through a replica.
func publishPolicy(t testing.TB, addr string, burst, maxReservation int64) {
	t.Helper()
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _, err = c.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: burst, MaxReservation: maxReservation}},
		// Holds outlive the test, so nothing expires behind the model's
		// back (the model has no expiry).
		HoldTtl: durationpb.New(time.Hour),
	})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// Three replicas on one schema, gateways spread over them reserving from
// one subject with the seed's numbers (capacity 1,000, estimates of 600,
// 200, 100 and 50, random actual usage), while one replica is SIGKILLed and
// restarted and client connections are cut. Afterwards: no unit was
// admitted beyond capacity, the audit finds nothing, every acknowledged
// reservation and settle is stored, and the clients' history is
// linearizable (porcupine).
//
// A call whose answers were all lost (the SDK's retries used up while the
// replica was down, or under a slow machine's timeouts) is resolved as
// the SDK's contract says a gateway must: repeated with the same ids,
// through any replica, until the ledger answers (a replay when the lost
// call was applied). The operation then spans the first call to that
// answer and has that outcome. So no operation stays open to the end of
// the history, at most one per gateway is in flight at any time, and the
// checker's search stays small however many answers the machine's load
// lost: an open-ended unknown outcome, which porcupine may place anywhere
// after its call, made the search grow exponentially with their number
// and pass its time limit on a loaded machine.
func TestReplicasLinearizableUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs three server processes")
	}
	dsn := schemaDSN(t)
	bin := replicatest.BuildCapledger(t)
	var replicas []*replicatest.Replica
	var cutters []*cutter
	for range 3 {
		r := replicatest.StartReplica(t, bin, dsn)
		replicas = append(replicas, r)
		cutters = append(cutters, newCutter(t, r.Addr))
	}
	const capacity = 1000
	publishPolicy(t, replicas[0].Addr, capacity, capacity)

	var clients []*client.Client
	for _, c := range cutters {
		cl, err := client.New(c.addr(), client.WithTimeout(3*time.Second),
			client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 8, BaseDelay: 20 * time.Millisecond, MaxDelay: 400 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients = append(clients, cl)
	}

	const gateways, perGateway = 8, 14
	var repeated atomic.Int32 // calls repeated for want of an answer
	// resolve runs call until it succeeds or fails with an answer of the
	// ledger, repeating it while its answer is lost or nothing could be
	// sent, for at most resolveWithin; lost is set when no repeat was
	// answered by then. It returns the last call's error.
	resolve := func(call func() error) (lost bool, err error) {
		for deadline, first := time.Now().Add(resolveWithin), true; ; first = false {
			if err = call(); err == nil || ledgerAnswered(err) {
				return false, err
			}
			if first {
				repeated.Add(1)
			}
			if time.Now().After(deadline) {
				return true, err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	sizes := []int64{600, 200, 100, 50}
	h := replicatest.NewHistory()
	var (
		mu           sync.Mutex
		acknowledged = map[string]int64{} // reserve ok: id -> units
		settled      = map[string]int64{} // settle ok: id -> actual
	)
	// Faults follow the load's progress, not the clock, so a fast machine
	// cannot finish the load before them: every 15 recorded operations one
	// replica's client connections are cut, and at the third signal replica
	// 2 is SIGKILLed mid-load and restarted.
	faultCh := make(chan struct{}, 64)
	record := func(client int, call int64, in replicatest.AccountInput, out replicatest.AccountOutput) {
		if n := h.Record(client, call, in, out); n%15 == 0 {
			select {
			case faultCh <- struct{}{}:
			default:
			}
		}
	}

	loadDone := make(chan struct{})
	var kills atomic.Int32
	var faults sync.WaitGroup
	faults.Add(1)
	go func() {
		defer faults.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 1; ; i++ {
			select {
			case <-loadDone:
				return
			case <-faultCh:
			}
			if i == 3 {
				kills.Add(1)
				replicas[2].Kill()
				time.Sleep(200 * time.Millisecond)
				replicas[2].Start()
				continue
			}
			cutters[rng.IntN(len(cutters))].cut()
		}
	}()

	var wg sync.WaitGroup
	for gw := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(gw), 42))
			for i := range perGateway {
				id := fmt.Sprintf("rl-g%d-%d", gw, i)
				units := sizes[rng.IntN(len(sizes))]
				in := replicatest.AccountInput{ID: id, Units: units}
				call := h.Now()
				reserve := func() error {
					_, err := clients[rng.IntN(len(clients))].Reserve(ctx, client.ReserveRequest{ReservationID: id,
						Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": units}})
					return err
				}
				var rejection *client.RejectedError
				lost, err := resolve(reserve)
				switch {
				case lost:
					t.Errorf("reserve %s: no replica answered its repeats in %s: %v", id, resolveWithin, err)
					record(gw, call, in, replicatest.AccountOutput{Unknown: true})
					continue
				case err == nil:
					record(gw, call, in, replicatest.AccountOutput{OK: true})
					mu.Lock()
					acknowledged[id] = units
					mu.Unlock()
				case errors.As(err, &rejection):
					record(gw, call, in, replicatest.AccountOutput{Rejected: true})
					continue
				default:
					t.Errorf("reserve %s refused: %v", id, err)
					record(gw, call, in, replicatest.AccountOutput{Unknown: true})
					continue
				}
				// Small actuals keep the run about contention for held
				// capacity rather than running dry.
				actual := rng.Int64N(units/10 + 1)
				settle := replicatest.AccountInput{Settle: true, ID: id, Units: units, Actual: actual}
				call = h.Now()
				op := "op-" + id
				lost, err = resolve(func() error { _, err := clients[rng.IntN(len(clients))].Start(ctx, id, op); return err })
				if err == nil && !lost {
					lost, err = resolve(func() error {
						_, err := clients[rng.IntN(len(clients))].Settle(ctx, id, op, client.Units{"tokens": actual})
						return err
					})
				}
				switch {
				case lost:
					t.Errorf("start/settle %s: no replica answered its repeats in %s: %v", id, resolveWithin, err)
					record(gw, call, settle, replicatest.AccountOutput{Unknown: true})
				case err == nil:
					record(gw, call, settle, replicatest.AccountOutput{OK: true})
					mu.Lock()
					settled[id] = actual
					mu.Unlock()
				default:
					t.Errorf("start/settle %s refused: %v", id, err)
					record(gw, call, settle, replicatest.AccountOutput{Unknown: true})
				}
			}
		}()
	}
	wg.Wait()
	close(loadDone)
	faults.Wait()

	// The database's view, read directly.
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	snap := mustAudit(t, s)
	var reserved, spent, sources int64
	for _, a := range snap.Accounts {
		if a.Key.SubjectKey() == tenant7 {
			reserved += a.Balances[0].Reserved
			spent += a.Balances[0].Spent
			sources += a.Balances[0].Opening + a.Balances[0].Minted
		}
	}
	if reserved+spent > sources || sources != capacity {
		t.Errorf("oversold: reserved %d + spent %d > capacity %d (sources %d)", reserved, spent, capacity, sources)
	}
	for id, units := range acknowledged {
		r, err := s.ReservationGet(context.Background(), id)
		if err != nil || r.Reserved[0] != units {
			t.Errorf("acknowledged reservation %s (%d): stored %+v, %v", id, units, r.Reserved, err)
		}
	}
	for id, actual := range settled {
		r, err := s.ReservationGet(context.Background(), id)
		if err != nil || r.State != ledger.StateSettled || r.Actual[0] != actual {
			t.Errorf("acknowledged settle %s (%d): stored %s %+v, %v", id, actual, r.State, r.Actual, err)
		}
	}

	checked := h.CheckLinearizable(t, replicatest.AccountModel(capacity), 30*time.Second)
	ops, unknown, _ := h.Counts()
	var cuts int32
	for _, c := range cutters {
		cuts += c.cuts.Load()
	}
	t.Logf("%d operations (%d calls repeated until answered after their answers were lost, %d never answered), %d reservations acknowledged, %d settles; %d connection cuts, %d replica kills; linearizability checked in %s",
		ops, repeated.Load(), unknown, len(acknowledged), len(settled), cuts, kills.Load(), checked.Round(time.Millisecond))
	if kills.Load() == 0 {
		t.Error("the load ended before the replica was killed: the run tested no crash")
	}
}

// ledgerAnswered reports whether err is an answer the ledger decided (a
// refusal for capacity or another ledger error), as opposed to a lost
// answer or a call that could not be sent.
func ledgerAnswered(err error) bool {
	var rejection *client.RejectedError
	var refusal *client.LedgerError
	return errors.As(err, &rejection) || errors.As(err, &refusal)
}

// resolveWithin is how long a gateway of TestReplicasLinearizableUnderFaults
// repeats a call whose answers were lost before the test gives up on it:
// far longer than a replica's restart, so only a ledger that stopped
// answering reaches it.
const resolveWithin = 2 * time.Minute

// BenchmarkReplicasReserve measures reserves per second through two real
// replicas on one PostgreSQL schema, on one hot account, from 64
// concurrent gateways spread over both: with --max-batch 1 every command
// is its own transaction (what a server without group commit does), with
// the default the engine groups whatever is waiting into one transaction.
func BenchmarkReplicasReserve(b *testing.B) {
	bin := replicatest.BuildCapledger(b)
	for _, maxBatch := range []int{1, 512} {
		b.Run(fmt.Sprintf("max-batch=%d", maxBatch), func(b *testing.B) {
			dsn := schemaDSN(b)
			var clients []*client.Client
			for i := range 2 {
				r := replicatest.StartReplica(b, bin, dsn, "--max-batch", fmt.Sprint(maxBatch))
				if i == 0 {
					publishPolicy(b, r.Addr, 1<<50, 1<<50)
				}
				c, err := client.New(r.Addr, client.WithMaxIdleConns(64))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { c.Close() })
				clients = append(clients, c)
			}
			ctx := context.Background()
			reserve := func(c *client.Client) error {
				_, err := c.Reserve(ctx, client.ReserveRequest{ReservationID: nextID(), Subject: tenant7.Subject,
					Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": 1}})
				return err
			}
			if err := reserve(clients[0]); err != nil { // opens the account
				b.Fatal(err)
			}
			runGateways(b, 64, func(g int) error { return reserve(clients[g%2]) })
		})
	}
}
