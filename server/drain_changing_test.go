package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// publishingPasses, once armed, runs publish during each DrainProgress
// pass (at its read of the generation's unreconciled shards, after its
// accounts): another operator publishing under the key all the while.
type publishingPasses struct {
	store.Store
	mu      sync.Mutex
	publish func() // nil: disarmed
	passes  int
}

func (s *publishingPasses) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) ([]ledger.Shard, error) {
	s.mu.Lock()
	publish := s.publish
	if publish != nil {
		s.passes++
	}
	s.mu.Unlock()
	if publish != nil {
		publish()
	}
	return s.Store.ShardsUnreconciled(ctx, f)
}

// supersedeAndKeepPublishing publishes generation 1 of tenant-a's key,
// reserves under it and supersedes it with generation 2, then arms passes
// to publish another generation of the key during each DrainProgress pass.
func supersedeAndKeepPublishing(h *harness, passes *publishingPasses) {
	policy := `{"policy":{"subject":"tenant-a","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"%d"}]}}`
	h.ok("PublishPolicy", fmt.Sprintf(policy, 1000), "")
	h.ok("Reserve", reserveFor("d1", "tenant-a", 10), "")
	h.ok("PublishPolicy", fmt.Sprintf(policy, 2000), "") // generation 2 supersedes 1
	burst := 3000
	passes.mu.Lock()
	passes.publish = func() {
		burst++
		h.ok("PublishPolicy", fmt.Sprintf(policy, burst), "")
	}
	passes.mu.Unlock()
}

// DrainProgress of a superseded generation whose key is published to
// during each of its passes answers 503 with its own reason,
// POLICY_CHANGING, and a Retry-After, not STORE_UNAVAILABLE: nothing is
// wrong with the store. Once the publishes stop it answers. Each store.
func TestDrainProgressWhileItsKeyKeepsChanging(t *testing.T) {
	for name, pg := range map[string]bool{"sqlite": false, "postgres": true} {
		t.Run(name, func(t *testing.T) {
			passes := &publishingPasses{}
			h := newHarness(t, harnessOptions{postgres: pg, wrapStore: func(st store.Store) store.Store {
				passes.Store = st
				return passes
			}})
			supersedeAndKeepPublishing(h, passes)

			r := h.rollout("DrainProgress", `{"generations":["1"]}`, "")
			passes.mu.Lock()
			passes.publish = nil
			n := passes.passes
			passes.mu.Unlock()
			h.wantError(r, http.StatusServiceUnavailable, "unavailable", "POLICY_CHANGING")
			if n < 2 {
				t.Errorf("%d passes published to; want every pass, several", n)
			}
			if !strings.Contains(fmt.Sprint(r.body["message"]), "active generation changed") {
				t.Errorf("message %q: want it to say the key's active generation changed", r.body["message"])
			}
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("Retry-After %q: want whole seconds, at least 1", r.header.Get("Retry-After"))
			}
			got := h.rolloutOK("DrainProgress", `{"generations":["1"]}`, "")
			if g := got["generations"].([]any)[0].(map[string]any); g["active"] == true || got["drained"] == true {
				t.Errorf("once the publishes stop: %v; want generation 1 inactive, not drained", got)
			}
		})
	}
}

// The same POLICY_CHANGING answer over each RPC transport a client of the
// RolloutService uses (Connect protobuf, gRPC, gRPC-Web): code
// unavailable, the ErrorDetail's reason, and a Retry-After of whole
// seconds, at least 1, in the error's metadata (gRPC's trailers).
func TestDrainProgressPolicyChangingOverEveryTransport(t *testing.T) {
	passes := &publishingPasses{}
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		passes.Store = st
		return passes
	}})
	supersedeAndKeepPublishing(h, passes)
	defer func() {
		passes.mu.Lock()
		passes.publish = nil
		passes.mu.Unlock()
	}()
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	transport := &http.Transport{Protocols: protocols}
	t.Cleanup(transport.CloseIdleConnections)
	hc := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	for _, c := range []struct {
		name string
		opts []connect.ClientOption
	}{{"connect", nil}, {"grpc", []connect.ClientOption{connect.WithGRPC()}}, {"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}}} {
		t.Run(c.name, func(t *testing.T) {
			client := capledgerv1connect.NewRolloutServiceClient(hc, h.url, c.opts...)
			_, err := client.DrainProgress(context.Background(), connect.NewRequest(&v1.DrainProgressRequest{Generations: []uint64{1}}))
			var cerr *connect.Error
			if !errors.As(err, &cerr) || cerr.Code() != connect.CodeUnavailable {
				t.Fatalf("DrainProgress: %v; want unavailable", err)
			}
			if d := onlyErrorDetail(t, c.name, detailsOf(t, cerr)); d.GetReason() != server.ReasonPolicyChanging {
				t.Errorf("reason %q; want %s", d.GetReason(), server.ReasonPolicyChanging)
			}
			if s, err := strconv.Atoi(cerr.Meta().Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("Retry-After %q; want whole seconds, at least 1", cerr.Meta().Get("Retry-After"))
			}
		})
	}
}

// detailsOf returns the error's details as messages.
func detailsOf(t *testing.T, cerr *connect.Error) []any {
	t.Helper()
	var out []any
	for _, d := range cerr.Details() {
		msg, err := d.Value()
		if err != nil {
			t.Fatalf("detail %s: %v", d.Type(), err)
		}
		out = append(out, msg)
	}
	return out
}
