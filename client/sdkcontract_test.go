package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/ledger"
)

// Contract tests of docs/CLIENTS.md and the shard part of
// docs/OPERATIONS.md, run against the real `capledger serve` binary over
// real sockets, with faultproxy where the network fails.

// A shard id is Provision's idempotency key, and the ledger answers an
// IssueShard with a known id by replaying its token, also once the shard
// is reconciled. A shard that has ended and been compacted out of the
// store must not come back from that replay: its capacity was spent and
// the rest reminted to the account, so admitting from it again would
// spend the same capacity twice.
func TestProvisionAgainAfterTheShardEndedAndWasCompactedIsRefused(t *testing.T) {
	rig := newEndedShardRig(t, 11, "sh-gw-a-tenant-7")
	ctx := context.Background()
	after := availableTokens(t, rig.direct)
	_, err := rig.em.Provision(ctx, rig.provision)
	if !errors.Is(err, ledger.ErrShardIDReused) {
		t.Fatalf("provision of the ended shard's id again: %v, want ErrShardIDReused", err)
	}
	if r, err := rig.offlineReserve(rig.request); !errors.Is(err, ErrNoShard) {
		t.Fatalf("offline reserve after the shard ended: %+v %v, want ErrNoShard", r, err)
	}
	heal(t, rig.proxy, rig.gw)
	if got := availableTokens(t, rig.direct); got != after {
		t.Fatalf("available %d, was %d", got, after)
	}
}

// endedShardRig is a gateway (store in storeDir, compacting as soon as an
// ended shard's records outweigh the rest) before the ledger binary: it
// provisioned shard provision, served request from it while the ledger
// was unreachable (served: reserved 100 tokens, started, settled 60),
// reconciled once the ledger answered, and the shard ended and was
// compacted out of the store.
type endedShardRig struct {
	proxy     *faultproxy.Proxy
	direct    *Client
	gw        *Client
	storeDir  string
	store     *ShardStore
	em        *Emergency
	provision ProvisionRequest
	request   ReserveRequest
	served    *EmergencyReservation
}

func newEndedShardRig(t *testing.T, seed uint64, shardID string) *endedShardRig {
	t.Helper()
	dir := t.TempDir()
	_, proxy, direct, gw := newPartitionRig(t, dir, seed)
	ctx := context.Background()
	rig := &endedShardRig{proxy: proxy, direct: direct, gw: gw, storeDir: filepath.Join(dir, "gw-a"),
		provision: ProvisionRequest{ShardID: shardID, Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1000}, TTL: time.Hour},
		request:   ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}}
	var err error
	rig.store, err = OpenShardStore(rig.storeDir, ShardStoreOptions{GatewayID: "gw-a", compactAt: 1})
	if err != nil {
		t.Fatal(err)
	}
	store := rig.store
	t.Cleanup(func() { store.Close() })
	rig.em = NewEmergency(gw, rig.store, EmergencyOptions{})
	if _, err := rig.em.Provision(ctx, rig.provision); err != nil {
		t.Fatal(err)
	}
	rig.served, err = rig.offlineReserve(rig.request)
	if err != nil || rig.served.Local == nil {
		t.Fatalf("offline reserve: %+v %v", rig.served, err)
	}
	if err := rig.em.Start(ctx, rig.served.ReservationID, "op-1"); err != nil {
		t.Fatal(err)
	}
	if err := rig.em.Settle(ctx, rig.served.ReservationID, "op-1", Units{"tokens": 60}); err != nil {
		t.Fatal(err)
	}
	heal(t, proxy, gw)
	if _, err := rig.em.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if shards := rig.store.Shards(); len(shards) != 0 {
		t.Fatalf("the ended shard was not compacted away: %+v", shards)
	}
	if got := availableTokens(t, direct); got != 10_000-60 {
		t.Fatalf("available after reconciliation %d, want %d", got, 10_000-60)
	}
	return rig
}

// partition cuts the gateway off the ledger (heal reconnects it).
func (rig *endedShardRig) partition() {
	rig.proxy.SetFaults(faultproxy.Faults{Partition: true})
	rig.proxy.CutAll()
}

// offlineReserve sends request with the ledger unreachable.
func (rig *endedShardRig) offlineReserve(request ReserveRequest) (*EmergencyReservation, error) {
	rig.partition()
	ctx, cancel := context.WithTimeout(context.Background(), offlineTimeout)
	defer cancel()
	return rig.em.Reserve(ctx, request)
}

// endedState polls the ledger until reservation id has left RESERVED and
// STARTED (the middleware settles or marks after the response was
// written), and returns it.
func endedState(t *testing.T, c *Client, id string) *ledgerv1.Reservation {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := c.GetReservation(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		switch res.GetState() {
		case ledgerv1.ReservationState_RESERVATION_STATE_RESERVED, ledgerv1.ReservationState_RESERVATION_STATE_STARTED:
		default:
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservation %s still %s", id, res.GetState())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CLIENTS.md section 8: UsageFromStream settles the usage object of a
// stream's last event, read as the SSE specification reads a stream, and
// a stream whose usage is not known is USAGE_UNKNOWN: held, never
// refunded. The specification ignores a byte order mark at the start of a
// stream, so a stream that begins with one is read as without it. A last
// usage event that does not state the count a unit is mapped to says
// nothing of that unit: 0 would refund the whole estimate, so it is
// unknown.
func TestMiddlewareStreamUsageAgainstTheLedgerBinary(t *testing.T) {
	addr := startLedgerProcess(t, t.TempDir())
	c, err := New(addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	publishTenantPolicy(t, c, false)
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		switch r.URL.Query().Get("stream") {
		case "bom":
			fmt.Fprint(w, "\uFEFFdata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\ndata: [DONE]\n\n")
		case "no-total":
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":null}}\n\ndata: [DONE]\n\n")
		}
	})
	srv := gateway(t, c, MiddlewareConfig{Estimator: tokensEstimator,
		Usage: UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)}, backend)
	stream := func(kind string) *ledgerv1.Reservation {
		t.Helper()
		resp, body := send(t, srv.Client(), srv.URL+"?stream="+kind, "tenant-7", "{}")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "[DONE]") {
			t.Fatalf("%s stream: %d %q", kind, resp.StatusCode, body)
		}
		return endedState(t, c, resp.Header.Get(ReservationHeader))
	}

	if res := stream("bom"); res.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED || res.GetActualUnits()["tokens"] != 21 {
		t.Errorf("stream starting with a byte order mark: %s %v, want SETTLED with 21 tokens", res.GetState(), res.GetActualUnits())
	}
	res := stream("no-total")
	if res.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN {
		t.Errorf("last usage event without total_tokens: %s %v, want USAGE_UNKNOWN (not settled at 0)", res.GetState(), res.GetActualUnits())
	}
	// 100 estimated, 21 settled, 100 held unknown.
	if got := availableTokens(t, c); got != 10_000-21-100 {
		t.Errorf("available %d, want %d", got, 10_000-21-100)
	}
}

// CLIENTS.md section 4, rule 4, and section 5: a Settle that was not
// applied because the ledger died (kill -9 while the work ran) leaves the
// work STARTED and its usage known only to the gateway; Run returns
// *UsageUnknownError with the receipt and its usage, keeps it in
// PendingUnknown, and resends it with the same ids once the ledger is
// back, until it lands: charged exactly once, at the usage reported.
func TestSettleNotAppliedWhileTheLedgerIsKilledLandsAfterItsRestart(t *testing.T) {
	p := newLedgerProcess(t, t.TempDir())
	ctx := context.Background()
	c, err := New(p.addr, noBreakerWatchdog,
		WithRetryPolicy(RetryPolicy{MaxAttempts: 3, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	publishTenantPolicy(t, c, false)
	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) {
			p.stop(syscall.SIGKILL)
			return Units{"tokens": 40}, nil
		})
	unknown := mustErrAs[*UsageUnknownError](t, err)
	if unknown.Receipt.Actual["tokens"] != 40 {
		t.Fatalf("receipt %+v: want the reported 40 tokens", unknown.Receipt)
	}
	if kept := c.PendingUnknown(); len(kept) != 1 || kept[0].ReservationID != unknown.Receipt.ReservationID {
		t.Fatalf("PendingUnknown %+v, want the receipt of %s", kept, unknown.Receipt.ReservationID)
	}

	p.start()
	deadline := time.Now().Add(20 * time.Second)
	for len(c.PendingUnknown()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the kept settle was not resent after the restart: %+v (breaker %+v)", c.PendingUnknown(), c.Breaker())
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := c.GetReservation(ctx, unknown.Receipt.ReservationID)
	if err != nil {
		t.Fatal(err)
	}
	if res.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED || res.GetActualUnits()["tokens"] != 40 ||
		res.GetOperationId() != unknown.Receipt.OperationID {
		t.Fatalf("after the restart: %s %v op %s, want SETTLED with 40 tokens under %s", res.GetState(), res.GetActualUnits(), res.GetOperationId(), unknown.Receipt.OperationID)
	}
	if got := availableTokens(t, c); got != 10_000-40 {
		t.Fatalf("available %d, want %d", got, 10_000-40)
	}
}

// intermediary is a reverse proxy in front of the ledger that answers the
// next requests itself, in plain HTTP as a load balancer does, with
// status and Retry-After, and records when each request arrived.
type intermediary struct {
	mu       sync.Mutex
	answers  []int // statuses for the next requests; 0 or none: forward
	retry    string
	arrivals []time.Time
}

func startIntermediary(t *testing.T, ledgerAddr string) (*intermediary, string) {
	t.Helper()
	in := &intermediary{}
	forward := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: ledgerAddr})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.mu.Lock()
		in.arrivals = append(in.arrivals, time.Now())
		status := 0
		if len(in.answers) > 0 {
			status, in.answers = in.answers[0], in.answers[1:]
		}
		in.mu.Unlock()
		if status == 0 {
			forward.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", in.retry)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		fmt.Fprintf(w, "<html>%d</html>", status)
	}))
	t.Cleanup(srv.Close)
	return in, strings.TrimPrefix(srv.URL, "http://")
}

func (in *intermediary) answerNext(retryAfter string, statuses ...int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.answers, in.retry, in.arrivals = statuses, retryAfter, nil
}

func (in *intermediary) arrived() []time.Time {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.arrivals)
}

// CLIENTS.md section 4: a 503 from a proxy in between is a lost answer,
// retried, and its Retry-After is waited for (bounded by the backoff
// cap) before the repeat (rule 3); an HTTP 429 is never retried (rule
// 5): the caller gets a *RejectedError with its Retry-After, and no
// RESERVATION_UNKNOWN, since the refusal is an answer. Both come from an
// intermediary in plain HTTP, not in the ledger's error form.
func TestIntermediaryRetryAfterAndTooManyRequests(t *testing.T) {
	addr := startLedgerProcess(t, t.TempDir())
	ctx := context.Background()
	direct, err := New(addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	publishTenantPolicy(t, direct, false)
	in, inAddr := startIntermediary(t, addr)
	const maxDelay = 300 * time.Millisecond
	c, err := New(inAddr, noBreakerWatchdog, WithRetryPolicy(RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: maxDelay}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reserve := ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}

	in.answerNext("1", http.StatusServiceUnavailable)
	if _, err := c.Reserve(ctx, reserve); err != nil {
		t.Fatalf("reserve after one 503: %v", err)
	}
	if at := in.arrived(); len(at) != 2 || at[1].Sub(at[0]) < maxDelay {
		t.Fatalf("the repeat after a 503 with Retry-After: 1 came %v after it (%d requests), want at least the cap %v", at[1].Sub(at[0]), len(at), maxDelay)
	}

	in.answerNext("7", http.StatusTooManyRequests)
	_, err = c.Reserve(ctx, reserve)
	rejected := mustErrAs[*RejectedError](t, err)
	if rejected.RetryAfter != 7*time.Second {
		t.Errorf("rejection %+v: want its Retry-After of 7 s", rejected)
	}
	// The ledger decided nothing: the reason says who refused, and no
	// limiting dimension or generation is made up.
	if rejected.Reason != ReasonProxyRefused || rejected.Dimension != "" || rejected.Generation != 0 {
		t.Errorf("rejection %+v of a proxy's plain 429: want reason %s, no dimension, no generation", rejected, ReasonProxyRefused)
	}
	if n := len(in.arrived()); n != 1 {
		t.Errorf("a 429 was sent %d times, want once (never retried)", n)
	}
	if lost := c.LostReserves(); len(lost) != 0 {
		t.Errorf("a 429 left lost reserves to look up: %+v", lost)
	}
	if got := availableTokens(t, direct); got != 10_000-100 {
		t.Errorf("available %d, want %d (only the first reserve)", got, 10_000-100)
	}
}

// A retry of a request served from a shard, after the shard ended and was
// compacted out of the store, gets the same answer as before, from the
// store: the Reserve replays (Retired) and is not sent to the ledger,
// which does not know the id and would admit it anew (the capacity
// charged a second time), nor admitted from a newer shard while the
// ledger is unreachable; the settle answers "already settled" instead of
// the ledger's NOT_FOUND; a retried Emergency.Run runs nothing and its
// error wraps ledger.ErrReservationRetired (it used not to, unlike every
// other answer from a tombstone). Also after a gateway restart.
func TestARetryOfARequestServedFromAnEndedShardIsNeverAdmittedAgain(t *testing.T) {
	rig := newEndedShardRig(t, 12, "sh-1")
	ctx := context.Background()
	direct, gw, em, store, first := rig.direct, rig.gw, rig.em, rig.store, rig.served
	available := availableTokens(t, direct)

	retry := rig.request
	retry.ReservationID, retry.RequestDigest = first.ReservationID, first.RequestDigest
	retried := func(when string, em *Emergency) {
		t.Helper()
		r, err := em.Reserve(ctx, retry)
		if err != nil || r.Local == nil || !r.Local.Replayed || !r.Local.Retired || r.Local.State != ledger.StateSettled {
			t.Fatalf("%s: retried reserve: %+v %v, want the local receipt replayed (retired, SETTLED)", when, r, err)
		}
		if err := em.Settle(ctx, first.ReservationID, "op-1", Units{"tokens": 60}); !errors.Is(err, ledger.ErrReservationAlreadySettled) {
			t.Fatalf("%s: retried settle: %v, want already settled", when, err)
		}
		ran := false
		res, err := em.Run(ctx, retry, func(context.Context) (Units, error) { ran = true; return Units{"tokens": 60}, nil })
		if ran || res != nil || !errors.Is(err, ledger.ErrReservationRetired) {
			t.Fatalf("%s: retried Run: ran %v, %+v %v, want the work not run and an error wrapping ErrReservationRetired", when, ran, res, err)
		}
		if got := availableTokens(t, direct); got != available {
			t.Fatalf("%s: available %d, was %d: the retry was charged again", when, got, available)
		}
	}
	retried("ledger reachable", em)

	// Unreachable, with a fresh shard that has room: still a replay.
	if _, err := em.Provision(ctx, ProvisionRequest{ShardID: "sh-2", Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1000}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	available = availableTokens(t, direct)
	r, err := rig.offlineReserve(retry)
	if err != nil || r.Local == nil || !r.Local.Retired || r.Local.ShardID != "sh-1" {
		t.Fatalf("offline retry: %+v %v, want the retired receipt of sh-1", r, err)
	}
	if shards := store.Shards(); len(shards) != 1 || shards[0].Available["tokens"] != 1000 {
		t.Fatalf("the fresh shard admitted the retry: %+v", shards)
	}
	heal(t, rig.proxy, gw)

	// The gateway restarts.
	store.Close()
	store, err = OpenShardStore(rig.storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	retried("after a restart", NewEmergency(gw, store, EmergencyOptions{}))
}

// A Settle the SDK could not send at all (connection refused, breaker
// open) applied nothing: the work stays STARTED and its usage is known
// only to the caller. A direct Client.Settle says so with the transport
// error (connect code Unavailable, Unreachable true, ErrLedgerUnreachable
// once the breaker is open), not a *LostError, and keeps no receipt: only
// Run and the middleware keep and resend such a settle (docs/CLIENTS.md,
// section 4, rule 4; Settle's godoc). Sending it again with the same
// values once the ledger is back applies it, for the first time.
func TestDirectSettleNotSentIsTheCallersToSendAgain(t *testing.T) {
	p := newLedgerProcess(t, t.TempDir())
	ctx := context.Background()
	// The set-up's calls go through a client without the watchdog: on a
	// loaded machine an answer later than the tested client's 50 ms would
	// open its breaker (for an hour) before the ledger is killed.
	setup, err := New(p.addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	publishTenantPolicy(t, setup, false)
	r, err := setup.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	if err != nil {
		t.Fatal(err)
	}
	op := NewOperationID()
	if _, err := setup.Start(ctx, r.ReservationID, op); err != nil {
		t.Fatal(err)
	}
	p.stop(syscall.SIGKILL)
	c, err := New(p.addr, WithBreaker(BreakerPolicy{FailureThreshold: 1, DetectTimeout: 50 * time.Millisecond, ProbeBase: time.Hour, ProbeMax: time.Hour}),
		WithRetryPolicy(RetryPolicy{MaxAttempts: 3, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	notSent := func(what string, err error) {
		t.Helper()
		var lost *LostError
		if err == nil || errors.As(err, &lost) || connect.CodeOf(err) != connect.CodeUnavailable || !Unreachable(err) {
			t.Fatalf("%s: %T %v, want the transport error (code unavailable, not *LostError)", what, err, err)
		}
		if kept := c.PendingUnknown(); len(kept) != 0 {
			t.Fatalf("%s: PendingUnknown %+v, want nothing kept by a direct Settle", what, kept)
		}
	}
	_, err = c.Settle(ctx, r.ReservationID, op, Units{"tokens": 40})
	notSent("settle refused", err)
	deadline := time.Now().Add(10 * time.Second)
	for c.Breaker().State != BreakerOpen {
		if time.Now().After(deadline) {
			t.Fatalf("breaker %+v did not open", c.Breaker())
		}
		time.Sleep(10 * time.Millisecond)
		_, _ = c.GetReservation(ctx, r.ReservationID) // a failure once no answer came for DetectTimeout opens it
	}
	_, err = c.Settle(ctx, r.ReservationID, op, Units{"tokens": 40})
	notSent("settle with the breaker open", err)
	if !errors.Is(err, ErrLedgerUnreachable) {
		t.Fatalf("settle with the breaker open: %v, want ErrLedgerUnreachable", err)
	}
	_, err = c.Start(ctx, r.ReservationID, op)
	notSent("start with the breaker open", err)
	_, err = c.Release(ctx, r.ReservationID)
	notSent("release with the breaker open", err)
	_, err = c.MarkUsageUnknown(ctx, r.ReservationID)
	notSent("mark usage unknown with the breaker open", err)

	p.start()
	direct, err := New(p.addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if got, err := direct.GetReservation(ctx, r.ReservationID); err != nil || got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_STARTED {
		t.Fatalf("after the refused settles: %v %v, want STARTED", got.GetState(), err)
	}
	res, err := direct.Settle(ctx, r.ReservationID, op, Units{"tokens": 40})
	if err != nil || res.Replayed || res.Reservation.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("settle sent again: %+v %v, want applied now (not a replay) with 40 tokens", res, err)
	}
}
