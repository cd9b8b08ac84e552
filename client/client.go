// Package client is the Go SDK for gateways in front of a capledger ledger.
//
// A gateway reserves the estimated capacity of a request before running it,
// starts it (binding an operation id), and settles the actual usage after
// it, exactly once. The SDK does the protocol work that makes this safe over
// an unreliable network:
//
//   - it mints the reservation id (a ULID) and the canonical request digest
//     itself, so every retry of one request carries the same id and digest
//     and the ledger never debits twice (RequestDigest documents the form);
//   - it retries lost answers with exponential backoff and full jitter, never
//     with a new id; a Reserve whose answer stays lost is resolved by looking
//     the id up (RESERVATION_UNKNOWN), never by reserving again;
//   - a capacity rejection (HTTP 429) is returned as *RejectedError with the
//     ledger's Retry-After, limiting dimension and policy generation, and is
//     never retried blindly;
//   - Run wraps reserve -> start -> work -> settle, releases work that never
//     started, and marks work whose usage is unknown USAGE_UNKNOWN instead of
//     refunding it; ResolveUnknown settles it later from the operation
//     receipt;
//   - Middleware does the same for a net/http handler and can queue reserved
//     requests in a weighted fair scheduler (package sched).
//
// docs/CLIENTS.md states the same protocol rules for clients in other
// languages.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/api/hotjson"
)

// Protocol selects the wire protocol. All three reach the same service on
// the same port.
type Protocol int

const (
	// ProtocolConnect is the Connect protocol with binary protobuf bodies
	// over HTTP/1.1 keep-alive connections (HTTP/2 over TLS). The default:
	// the cheapest per call.
	ProtocolConnect Protocol = iota
	// ProtocolConnectJSON is the Connect protocol with JSON bodies, the
	// form curl and clients in other languages use.
	ProtocolConnectJSON
	// ProtocolGRPC is gRPC over HTTP/2: h2c (prior knowledge) for http://
	// addresses, ALPN h2 for https://. All calls share one multiplexed
	// connection.
	ProtocolGRPC
)

func (p Protocol) String() string {
	switch p {
	case ProtocolConnect:
		return "connect"
	case ProtocolConnectJSON:
		return "connect-json"
	case ProtocolGRPC:
		return "grpc"
	}
	return fmt.Sprintf("Protocol(%d)", int(p))
}

// ParseProtocol returns the Protocol named "connect", "connect-json" (or
// "json") or "grpc", or an error for any other name.
func ParseProtocol(name string) (Protocol, error) {
	switch strings.ToLower(name) {
	case "connect", "connect-proto", "proto":
		return ProtocolConnect, nil
	case "connect-json", "json":
		return ProtocolConnectJSON, nil
	case "grpc":
		return ProtocolGRPC, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want connect, connect-json or grpc)", name)
}

// Defaults of the options.
const (
	DefaultTimeout      = 5 * time.Second
	DefaultDialTimeout  = 3 * time.Second
	DefaultMaxIdleConns = 512
)

type config struct {
	protocol     Protocol
	timeout      time.Duration
	dialTimeout  time.Duration
	maxIdleConns int
	tls          *tls.Config
	token        string
	httpClient   *http.Client
	retry        RetryPolicy
	breaker      BreakerPolicy
	lostHandler  func(LostReserve)
	operations   OperationStore // operations.go
	// pending.go
	pendingLimit   int
	pendingDropped func(OperationReceipt)
	pendingRefused func(OperationReceipt, error)
}

// Option configures New.
type Option func(*config)

// WithProtocol selects the wire protocol (default ProtocolConnect).
func WithProtocol(p Protocol) Option { return func(c *config) { c.protocol = p } }

// WithTimeout bounds each single call attempt (default 5s). A call that
// retries may take up to its attempts times this, bounded by the caller's
// context; the circuit breaker (WithBreaker) gives up on an unreachable
// ledger sooner.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithDialTimeout bounds connection establishment (default 3s).
func WithDialTimeout(d time.Duration) Option { return func(c *config) { c.dialTimeout = d } }

// WithMaxIdleConns sets how many idle keep-alive connections to the ledger
// are kept for reuse (default 512, enough for one per concurrent call of a
// busy gateway over HTTP/1.1).
func WithMaxIdleConns(n int) Option { return func(c *config) { c.maxIdleConns = n } }

// WithTLS makes the client use TLS with cfg (nil: the system roots). An
// address without a scheme then means https://.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c.tls = cfg
	}
}

// WithBearerToken sends "Authorization: Bearer <token>" on every call.
func WithBearerToken(token string) Option { return func(c *config) { c.token = token } }

// WithHTTPClient replaces the SDK's own tuned http.Client. The caller is
// then responsible for its transport (keep-alive, HTTP/2 for gRPC, TLS).
func WithHTTPClient(hc *http.Client) Option { return func(c *config) { c.httpClient = hc } }

// WithRetryPolicy replaces DefaultRetryPolicy.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *config) { c.retry = p } }

// Client talks to one ledger. It is safe for concurrent use and meant to be
// shared by a whole process: it holds one http.Client whose connections are
// reused across calls.
type Client struct {
	rpc      capledgerv1connect.LedgerServiceClient
	http     *http.Client
	ownsHTTP bool
	baseURL  string
	protocol Protocol
	timeout  time.Duration
	retry    RetryPolicy
	pending  *pendingReceipts
	// resends are the kept receipts resent in the background (guarded
	// by lookups.mu).
	resends resends
	breaker *breaker
	lookups *lookups
	// ops records Run's operations (WithOperationStore); nil for none.
	ops OperationStore
}

// New returns a Client for the ledger at addr ("host:port", "http://host:port"
// or "https://host:port"), or an error for a malformed address. It does not
// connect: the first call does.
func New(addr string, options ...Option) (*Client, error) {
	cfg := config{
		protocol:     ProtocolConnect,
		timeout:      DefaultTimeout,
		dialTimeout:  DefaultDialTimeout,
		maxIdleConns: DefaultMaxIdleConns,
		retry:        DefaultRetryPolicy,
		breaker:      DefaultBreakerPolicy,
	}
	for _, o := range options {
		o(&cfg)
	}
	cfg.retry = cfg.retry.withDefaults()
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("client: timeout must be positive, got %s", cfg.timeout)
	}
	baseURL, err := normalizeAddr(addr, cfg.tls != nil)
	if err != nil {
		return nil, err
	}
	hc, owns := cfg.httpClient, false
	if hc == nil {
		transport := newTransport(&cfg, strings.HasPrefix(baseURL, "https://"))
		hc, owns = &http.Client{Transport: transport}, true
		if cfg.protocol != ProtocolGRPC {
			// One write per call instead of two (see inlineBody).
			hc.Transport = inlineBody{next: transport}
		}
	}
	hc = withRecordedAnswers(hc)
	// No gzip: ledger messages are a few hundred bytes, and compressing
	// them costs the server more CPU than the bytes saved on a LAN (it was
	// a sixth of the server's CPU in the reserve benchmark).
	opts := []connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil)}
	switch cfg.protocol {
	case ProtocolConnect:
	case ProtocolConnectJSON:
		// connect's protojson codec, with the hot messages written and
		// read without reflection (unknown fields of a newer server are
		// discarded, as connect's own codec does).
		opts = append(opts, connect.WithCodec(hotjson.Codec{CodecName: "json"}))
	case ProtocolGRPC:
		opts = append(opts, connect.WithGRPC())
	default:
		return nil, fmt.Errorf("client: unknown protocol %d", int(cfg.protocol))
	}
	if cfg.token != "" {
		opts = append(opts, connect.WithInterceptors(bearer(cfg.token)))
	}
	c := &Client{
		rpc:      capledgerv1connect.NewLedgerServiceClient(hc, baseURL, opts...),
		http:     hc,
		ownsHTTP: owns,
		baseURL:  baseURL,
		protocol: cfg.protocol,
		timeout:  cfg.timeout,
		retry:    cfg.retry,
		pending:  newPendingReceipts(cfg.pendingLimit, cfg.pendingDropped, cfg.pendingRefused),
		lookups:  newLookups(cfg.lostHandler),
		ops:      cfg.operations,
	}
	c.breaker = newBreaker(cfg.breaker, c.probeLedger)
	return c, nil
}

func normalizeAddr(addr string, useTLS bool) (string, error) {
	if addr == "" {
		return "", errors.New("client: empty ledger address")
	}
	if !strings.Contains(addr, "://") {
		scheme := "http://"
		if useTLS {
			scheme = "https://"
		}
		addr = scheme + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", fmt.Errorf("client: ledger address %q: %w", addr, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("client: ledger address %q: want host:port, http://host:port or https://host:port", addr)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

func newTransport(cfg *config, useTLS bool) *http.Transport {
	dialer := &net.Dialer{Timeout: cfg.dialTimeout, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		// No environment proxy: ledger calls are internal and latency
		// critical, and an HTTP_PROXY meant for egress must not catch them.
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		MaxIdleConns:        cfg.maxIdleConns,
		MaxIdleConnsPerHost: cfg.maxIdleConns,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: cfg.dialTimeout,
		TLSClientConfig:     cfg.tls,
		ForceAttemptHTTP2:   useTLS,
		// The SDK sends small protobuf bodies; compression costs more CPU
		// than it saves on a LAN.
		DisableCompression: true,
	}
	if cfg.protocol == ProtocolGRPC {
		// gRPC needs HTTP/2. Over plain TCP that is h2c with prior
		// knowledge (no upgrade dance); over TLS it is negotiated by ALPN.
		p := new(http.Protocols)
		if useTLS {
			p.SetHTTP2(true)
		} else {
			p.SetUnencryptedHTTP2(true)
		}
		t.Protocols = p
	}
	return t
}

func bearer(token string) connect.UnaryInterceptorFunc {
	value := "Bearer " + token
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", value)
			return next(ctx, req)
		}
	}
}

// Close stops the breaker's prober and the background work (the lookups
// of lost Reserves, the resends of kept settles, Emergency's releases of
// late central holds, FairQueue's policy reads), waiting for them to
// return, and releases the idle
// connections of the SDK's own http.Client. It does not wait for the
// ledger: a background call in flight is cancelled (a release of a late
// central hold so cancelled is logged; unless it reached the ledger, the
// hold expires after its hold TTL). The Client must not be used
// afterwards. It returns nil.
func (c *Client) Close() error {
	c.breaker.shutdown()
	c.lookups.shutdown()
	if c.ownsHTTP {
		c.http.CloseIdleConnections()
	}
	return nil
}

// Raw returns the generated connect client, for calls the SDK does not wrap.
// It has no retries: the caller owns the protocol rules of docs/CLIENTS.md.
func (c *Client) Raw() capledgerv1connect.LedgerServiceClient { return c.rpc }

// Protocol returns the wire protocol in use.
func (c *Client) Protocol() Protocol { return c.protocol }
