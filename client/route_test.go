package client

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/internal/faultproxy"
)

// spread returns a transport that dials the proxies in turn, a new
// connection per request: a load balancer in front of the replicas.
func spread(proxies []*faultproxy.Proxy) *http.Transport {
	var dials atomic.Uint64
	var dialer net.Dialer
	return &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, proxies[dials.Add(1)%uint64(len(proxies))].Addr())
		},
	}
}

// byPath sends the ShardService's ReconcileShard calls through one
// transport and every other call through another.
type byPath struct{ Reconcile, Rest http.RoundTripper }

func (b byPath) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == capledgerv1connect.ShardServiceReconcileShardProcedure {
		return b.Reconcile.RoundTrip(r)
	}
	return b.Rest.RoundTrip(r)
}
