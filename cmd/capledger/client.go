package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/ledger"
)

// clientFlags are the flags of every command that talks to a server.
type clientFlags struct {
	addr   string
	token  string
	caFile string
	// certFile and keyFile are the client certificate and key offered to a
	// server that asks for one (serve --tls-client-ca).
	certFile, keyFile string
	timeout           time.Duration
	// certUnmet is set once a server asked for a client certificate and
	// this client had none, or one it cannot accept (tlsConfig); shared
	// with env, which words the failure of a command that used the SDK
	// or grpc-go.
	certUnmet *atomic.Bool
}

const clientFlagsHelp = `Connection flags (every command that talks to a server):
  --addr URL        server address (default $CAPLEDGER_ADDR, else http://127.0.0.1:7070)
  --token TOKEN     bearer token (default $CAPLEDGER_TOKEN); needed when the
                    server runs with --tokens
  --ca-file FILE    PEM CA certificates to verify an https:// server with,
                    instead of the system's roots (default $CAPLEDGER_CA):
                    for a server whose certificate a private CA signed
  --cert FILE       PEM client certificate (chain) for a server that requires
                    one, serve --tls-client-ca (default $CAPLEDGER_CERT);
                    needs --key
  --key FILE        its PEM private key (default $CAPLEDGER_KEY)
  --timeout DUR     give up after this long (default 10s)
`

func (c *clientFlags) register(fs *flag.FlagSet, e *env) {
	if e.certUnmet == nil {
		e.certUnmet = new(atomic.Bool)
	}
	c.certUnmet = e.certUnmet
	addr := e.getenv("CAPLEDGER_ADDR")
	if addr == "" {
		addr = "http://127.0.0.1:7070"
	}
	fs.StringVar(&c.addr, "addr", addr, "server address")
	fs.StringVar(&c.token, "token", e.getenv("CAPLEDGER_TOKEN"), "bearer token")
	fs.StringVar(&c.caFile, "ca-file", e.getenv("CAPLEDGER_CA"), "CA certificates (PEM)")
	fs.StringVar(&c.certFile, "cert", e.getenv("CAPLEDGER_CERT"), "client certificate (PEM)")
	fs.StringVar(&c.keyFile, "key", e.getenv("CAPLEDGER_KEY"), "client key (PEM)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "request timeout")
}

// client returns a LedgerService client speaking the Connect protocol
// over HTTP/1.1 (JSON-free binary protobuf; any proxy passes it), or a
// usageError for a malformed --addr or an unusable --ca-file.
func (c *clientFlags) client() (capledgerv1connect.LedgerServiceClient, error) {
	base, options, err := c.endpoint()
	if err != nil {
		return nil, err
	}
	hc, err := c.httpClient()
	if err != nil {
		return nil, err
	}
	return capledgerv1connect.NewLedgerServiceClient(hc, base, options...), nil
}

// shardClient returns a ShardService client with the same address, token
// and trusted CAs as client, or a usageError for a malformed --addr or an
// unusable --ca-file.
func (c *clientFlags) shardClient() (capledgerv1connect.ShardServiceClient, error) {
	base, options, err := c.endpoint()
	if err != nil {
		return nil, err
	}
	hc, err := c.httpClient()
	if err != nil {
		return nil, err
	}
	return capledgerv1connect.NewShardServiceClient(hc, base, options...), nil
}

// rolloutClient returns a RolloutService client with the same address,
// token and trusted CAs as client.
func (c *clientFlags) rolloutClient() (capledgerv1connect.RolloutServiceClient, error) {
	base, options, err := c.endpoint()
	if err != nil {
		return nil, err
	}
	hc, err := c.httpClient()
	if err != nil {
		return nil, err
	}
	return capledgerv1connect.NewRolloutServiceClient(hc, base, options...), nil
}

// tlsConfig returns the TLS settings for --ca-file, --cert and --key:
// TLS 1.2 or newer, trusting only the file's CA certificates when
// --ca-file is given (a private CA's server is then verified, and nothing
// the system roots sign is mistaken for it), offering the client
// certificate when --cert is. It returns nil with neither (Go's defaults:
// the system roots), and a usageError when a file cannot be read or holds
// no PEM certificate, or a key that does not match.
func (c *clientFlags) tlsConfig() (*tls.Config, error) {
	if c.caFile == "" && c.certFile == "" && c.keyFile == "" {
		return nil, nil
	}
	return c.clientTLS()
}

// clientTLS is tlsConfig's settings even with neither file given (then
// the system roots and no client certificate). Its GetClientCertificate
// sets certUnmet when a server asks for a certificate this client has
// not got, or one the server cannot accept.
func (c *clientFlags) clientTLS() (*tls.Config, error) {
	if (c.certFile == "") != (c.keyFile == "") {
		return nil, usagef("--cert and --key go together: give both files (or $CAPLEDGER_CERT and $CAPLEDGER_KEY), or neither")
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.caFile != "" {
		pool, err := loadCAPool(c.caFile)
		if err != nil {
			return nil, usagef("--ca-file: %v", err)
		}
		config.RootCAs = pool
	}
	if c.certFile != "" {
		cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, usagef("--cert %s with --key %s: %v", c.certFile, c.keyFile, err)
		}
		config.Certificates = []tls.Certificate{cert}
	}
	if c.certUnmet == nil {
		c.certUnmet = new(atomic.Bool)
	}
	unmet := c.certUnmet
	var cert *tls.Certificate
	if len(config.Certificates) > 0 {
		cert = &config.Certificates[0]
	}
	config.Certificates = nil
	config.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if cert == nil {
			unmet.Store(true)
			return &tls.Certificate{}, nil // no certificate: the server decides
		}
		if cri.SupportsCertificate(cert) != nil || !clientCertUsable(cert.Leaf, time.Now()) {
			unmet.Store(true)
		}
		return cert, nil
	}
	return config, nil
}

// clientCertUsable reports whether a server verifying leaf for client
// authentication, as serve --tls-client-ca does, can accept it: within
// its validity period, and with client-auth usage (or no extended key
// usage at all). The server's refusal of one that is not often reaches
// this client only as a reset connection.
func clientCertUsable(leaf *x509.Certificate, now time.Time) bool {
	if leaf == nil {
		return true // not parsed: the server decides
	}
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return false
	}
	if len(leaf.ExtKeyUsage) == 0 {
		return true
	}
	return slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) || slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny)
}

// sdk returns a Go SDK client (for the commands that need its retries or
// its emergency-shard machinery) with --addr, --token, --timeout and
// --ca-file applied, then opts; a usageError for a malformed --addr or an
// unusable --ca-file.
func (c *clientFlags) sdk(opts ...client.Option) (*client.Client, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	tlsConfig, err := c.tlsConfig()
	if err == nil && tlsConfig == nil && strings.HasPrefix(c.addr, "https://") {
		tlsConfig, err = c.clientTLS() // to see a client certificate asked for
	}
	if err != nil {
		return nil, err
	}
	base := []client.Option{client.WithTimeout(c.timeout)}
	if c.token != "" {
		base = append(base, client.WithBearerToken(c.token))
	}
	if tlsConfig != nil {
		base = append(base, client.WithTLS(tlsConfig))
	}
	sc, err := client.New(c.addr, append(base, opts...)...)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return sc, nil
}

// httpClient returns the http.Client of client, shardClient and status:
// Go's default transport with tlsConfig's roots and client certificate.
// A call that fails on a connection whose server asked for a client
// certificate this client has not got, or one its CAs did not sign,
// fails with a clientCertError (exit 1 and what to pass): in TLS 1.3 the
// server's refusal comes after the client's handshake, and often reaches
// the caller only as a closed connection.
func (c *clientFlags) httpClient() (*http.Client, error) {
	tlsConfig, err := c.clientTLS()
	if err != nil {
		return nil, err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConfig
	return &http.Client{Transport: &certRefusals{base: transport, unmet: c.certUnmet}}, nil
}

// certRefusals is a RoundTripper that turns the errors of a client whose
// certificate a server could not accept into clientCertErrors.
type certRefusals struct {
	base http.RoundTripper
	// unmet is set once a server asked for a client certificate and got
	// none, or one it cannot accept (tlsConfig).
	unmet *atomic.Bool
}

func (r *certRefusals) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.base.RoundTrip(req)
	if err != nil && r.unmet.Load() && !notConnected(err) {
		err = &clientCertError{err: err}
	}
	return resp, err
}

// notConnected reports whether err is a failure to open a connection
// (refused, unreachable, a name that does not resolve): no server heard
// this client, so none refused its certificate, whatever an earlier
// connection of the command was asked for (a proxy that asks for one
// without requiring it, then goes down). grpc-go reports its dial
// failures only as text.
func notConnected(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &dns) ||
		strings.Contains(err.Error(), "Error while dialing")
}

// clientCertError is a call that failed after a server asked for a client
// certificate this client could not give (certRefusals).
type clientCertError struct{ err error }

func (e *clientCertError) Error() string { return e.err.Error() }
func (e *clientCertError) Unwrap() error { return e.err }

// endpoint returns the base URL of --addr ("host:port" means http; a
// path, a proxy's prefix, is kept) and the options that send --token as a
// bearer token on every call; a usageError if --addr is no http or https
// URL with a host (or has a query or fragment, which no call could carry)
// or --timeout is not above 0: a malformed address is a bad flag (exit
// 1), never an unavailable server.
func (c *clientFlags) endpoint() (string, []connect.ClientOption, error) {
	if err := c.check(); err != nil {
		return "", nil, err
	}
	addr := c.addr
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", nil, usagef("--addr %q: want http://host:port or https://host:port (a path after it is kept)", c.addr)
	}
	var options []connect.ClientOption
	if c.token != "" {
		options = append(options, connect.WithInterceptors(bearerToken("Bearer "+c.token)))
	}
	return strings.TrimSuffix(addr, "/"), options, nil
}

// check returns checkTimeout's usageError, or one for a --token (or
// $CAPLEDGER_TOKEN) holding a control character, a line end most often:
// no header can carry it, and the call would fail as if the server were
// unavailable (exit 5) instead of as a bad flag.
func (c *clientFlags) check() error {
	if err := c.checkTimeout(); err != nil {
		return err
	}
	for _, r := range c.token {
		if r < 0x20 || r == 0x7f {
			return usagef("--token (or $CAPLEDGER_TOKEN) holds a control character (%q): a bearer token is one line of printable characters; strip the line end", r)
		}
	}
	return nil
}

// checkTimeout returns a usageError for a --timeout of 0 or less, which
// would give up before any answer could come and read as an unavailable
// server (exit 5) instead of a bad flag.
func (c *clientFlags) checkTimeout() error {
	if c.timeout <= 0 {
		return usagef("--timeout %s: want a duration above 0, such as 10s", c.timeout)
	}
	return nil
}

// bearerToken sets the Authorization header (its value) on every call,
// unary and streaming: capledger audit reads AuditService.StreamAudit, which
// a unary-only interceptor would send without the token.
type bearerToken string

func (b bearerToken) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearerToken) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearerToken) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (c *clientFlags) context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// unary makes one RPC with the given timeout (the --timeout flag) and
// returns the response message, or the call's error described with its
// code, reason and details (see describe).
func unary[Req, Res any](ctx context.Context, timeout time.Duration, call func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req) (*Res, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := call(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, describe(err)
	}
	return resp.Msg, nil
}

// printJSON writes a response as indented protobuf JSON (the same field
// names the JSON API uses), followed by a newline. protojson varies its
// whitespace on purpose; compacting and re-indenting makes the output
// stable for scripts and diffs.
func printJSON(w io.Writer, msg proto.Message) error {
	return printJSONWith(w, protojson.MarshalOptions{}, msg)
}

// printJSONAll is printJSON with every field present, for an answer whose
// zero values mean something (an active generation of 0 is "none"), which
// printJSON would print as {}.
func printJSONAll(w io.Writer, msg proto.Message) error {
	return printJSONWith(w, protojson.MarshalOptions{EmitUnpopulated: true}, msg)
}

// printJSONList is printJSON for an answer that lists something
// (backlog, debts, policy list, ...): its list, the message's first field
// in every such answer, is printed as [] when empty, where protojson
// leaves it out (and printJSON would print {}), so that a script's
// `jq '.reservations[]'` reads an empty answer as no entries instead of
// failing on null. So are the other list fields named in also (their
// proto names), e.g. one the answer has only in some configurations.
// Every other field prints as printJSON prints it, in protojson's order.
func printJSONList(w io.Writer, msg proto.Message, also ...protoreflect.Name) error {
	m := msg.ProtoReflect()
	fields := m.Descriptor().Fields()
	lists := []protoreflect.FieldDescriptor{fields.Get(0)}
	for _, name := range also {
		lists = append(lists, fields.ByName(name))
	}
	empty := map[string]bool{}
	for _, list := range lists {
		if list == nil || !list.IsList() {
			panic(fmt.Sprintf("printJSONList: %s: %v is not a list field", m.Descriptor().FullName(), also))
		}
		if m.Get(list).List().Len() == 0 {
			empty[list.JSONName()] = true
		}
	}
	if len(empty) == 0 {
		return printJSON(w, msg)
	}
	// Marshal every field for protojson's order, then print those
	// protojson prints, as it prints them, and the empty lists as [].
	var present map[string]json.RawMessage
	raw, err := protojson.Marshal(msg)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &present); err != nil {
		return err
	}
	return printJSONEdited(w, protojson.MarshalOptions{EmitUnpopulated: true}, msg, func(compact []byte) []byte {
		dec := json.NewDecoder(bytes.NewReader(compact))
		out := []byte{'{'}
		dec.Token() // {
		for dec.More() {
			key, _ := dec.Token()
			var value json.RawMessage
			if err := dec.Decode(&value); err != nil {
				panic(fmt.Sprintf("printJSONList: protojson printed %s: %v", compact, err))
			}
			name, _ := key.(string)
			if v, ok := present[name]; ok {
				value = v // as protojson prints it: no unpopulated fields inside
			} else if empty[name] {
				value = json.RawMessage("[]")
			} else {
				continue
			}
			if len(out) > 1 {
				out = append(out, ',')
			}
			k, _ := json.Marshal(name)
			out = append(append(append(out, k...), ':'), value...)
		}
		return append(out, '}')
	})
}

func printJSONWith(w io.Writer, opts protojson.MarshalOptions, msg proto.Message) error {
	return printJSONEdited(w, opts, msg, func(compact []byte) []byte { return compact })
}

// printJSONEdited prints msg as printJSONWith does, with its compact
// JSON first passed through edit.
func printJSONEdited(w io.Writer, opts protojson.MarshalOptions, msg proto.Message, edit func(compact []byte) []byte) error {
	raw, err := opts.Marshal(msg)
	if err != nil {
		return err
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return err
	}
	if err := json.Indent(&out, edit(compact.Bytes()), "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var x exitError
	if errors.As(err, &x) {
		return x.code
	}
	var u usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		if errors.Is(err, context.DeadlineExceeded) {
			return exitUnavailable
		}
		return exitUsage
	}
	if clientCertificateRefused(err) {
		return exitUsage // refused credentials
	}
	switch cerr.Code() {
	case connect.CodeResourceExhausted:
		return exitRejected
	case connect.CodeNotFound:
		return exitNotFound
	case connect.CodeFailedPrecondition, connect.CodeAlreadyExists, connect.CodeAborted:
		return exitConflict
	case connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodePermissionDenied,
		connect.CodeOutOfRange, connect.CodeUnimplemented:
		return exitUsage
	}
	return exitUnavailable
}

// describe turns a server error into a message that shows its code, reason
// and details (limiting dimension, retry-after, the reservation's state).
func describe(err error) error {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return err
	}
	parts := []string{cerr.Code().String() + ": " + cerr.Message()}
	waitShown := false // the RejectionDetail's retryAfter, which the header repeats
	if clientCertificateRefused(err) {
		// Connect's code for it is whichever the broken connection
		// suggested ("canceled" for a reset): not the server's word.
		parts[0] = cerr.Message()
	}
	if hint := certificateHint(err); hint != "" {
		parts = append(parts, hint)
	}
	for _, d := range cerr.Details() {
		msg, derr := d.Value()
		if derr != nil {
			continue
		}
		switch m := msg.(type) {
		case *v1.RejectionDetail:
			s := fmt.Sprintf("reason %s, limiting dimension %q, policy generation %d", m.GetReason(), m.GetLimitingDimension(), m.GetPolicyGeneration())
			if m.GetRetryAfter() != nil {
				s += ", retry after " + m.GetRetryAfter().AsDuration().String()
				waitShown = true
			}
			parts = append(parts, s)
		case *v1.ErrorDetail:
			s := "reason " + m.GetReason()
			if r := m.GetReservation(); r != nil {
				s += fmt.Sprintf(", reservation %s is %s", r.GetReservationId(), strings.TrimPrefix(r.GetState().String(), "RESERVATION_STATE_"))
			}
			parts = append(parts, s)
		}
	}
	// The header alone (a proxy's bare 429) still tells the wait; beside
	// the detail it says the same again.
	if ra := cerr.Meta().Get("Retry-After"); ra != "" && !waitShown {
		if _, convErr := strconv.Atoi(ra); convErr == nil {
			parts = append(parts, "Retry-After: "+ra+"s")
		}
	}
	// The server's words are for any client ("send Authorization:
	// Bearer"); an operator at a shell needs the flag.
	if cerr.Code() == connect.CodeUnauthenticated {
		parts = append(parts, "this server checks tokens: give yours with --token TOKEN or $CAPLEDGER_TOKEN")
	}
	return exitError{code: exitCode(err), err: describedError{text: strings.Join(parts, "; "), cause: cerr}}
}

// describedError is a server error as describe words it, still holding
// the error itself (for errorDetailReason).
type describedError struct {
	text  string
	cause *connect.Error
}

func (d describedError) Error() string { return d.text }
func (d describedError) Unwrap() error { return d.cause }

// errorDetailReason returns the reason of the ErrorDetail a server error
// carries (POLICY_GENERATION_CHANGED, ...), "" when it carries none.
func errorDetailReason(err error) string {
	return errorDetail(err).GetReason()
}

// errorDetail returns the ErrorDetail a server error carries, nil when it
// carries none.
func errorDetail(err error) *v1.ErrorDetail {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return nil
	}
	for _, d := range cerr.Details() {
		if m, derr := d.Value(); derr == nil {
			if detail, ok := m.(*v1.ErrorDetail); ok {
				return detail
			}
		}
	}
	return nil
}

// clientCertificateAlerts are the TLS alerts a server sends about the
// client's certificate (RFC 8446, 6.2): missing, or not one it accepts.
var clientCertificateAlerts = []string{
	"tls: certificate required", "tls: bad certificate", "tls: unknown certificate authority",
	"tls: unsupported certificate", "tls: revoked certificate", "tls: expired certificate",
	"tls: unknown certificate", "tls: access denied",
}

// clientCertificateRefused reports whether err is a server refusing this
// client's certificate, or its lack of one (serve --tls-client-ca):
// refused credentials, not an unreachable server. That is a
// clientCertError, or the server's TLS alert: Go reports a remote alert as
// a *net.OpError "remote error" around an unexported type, so the alert
// is told by its text.
func clientCertificateRefused(err error) bool {
	var unmet *clientCertError
	if errors.As(err, &unmet) {
		return true
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return false
	}
	return slices.Contains(clientCertificateAlerts, op.Err.Error())
}

// clientCertificateHint is what to do about a refused client certificate.
const clientCertificateHint = "the server requires a client certificate its CA signed (serve --tls-client-ca): pass --cert and --key (or set CAPLEDGER_CERT and CAPLEDGER_KEY) with one"

// certificateHint says what to do about a server certificate this client
// refused, or a client certificate the server refused, or returns "" when
// err is not about one. Connect reports such a failure as unavailable
// with Go's text, which does not mention --ca-file or --cert.
func certificateHint(err error) string {
	if clientCertificateRefused(err) {
		return clientCertificateHint
	}
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verification *tls.CertificateVerificationError
	switch {
	case errors.As(err, &unknownCA):
		return "the server's TLS certificate is signed by a CA this client does not trust: pass --ca-file (or set CAPLEDGER_CA) with that CA's certificate"
	case errors.As(err, &hostname):
		return "the server's TLS certificate is not valid for the host in --addr"
	case errors.As(err, &invalid):
		return "the server's TLS certificate is invalid (expired, not yet valid, or not for server use)"
	case errors.As(err, &verification):
		return "the server's TLS certificate could not be verified"
	}
	return ""
}

// parseUnits parses "tokens=600,requests=1" into a units map. Repeated
// names and non-integer or negative amounts are usage errors.
func parseUnits(flagName, spec string) (map[string]int64, error) {
	units := map[string]int64{}
	if strings.TrimSpace(spec) == "" {
		return units, nil
	}
	for _, part := range strings.Split(spec, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" {
			return nil, usagef("--%s %q: want unit=amount[,unit=amount...], e.g. tokens=600,requests=1", flagName, spec)
		}
		amount, err := strconv.ParseInt(value, 10, 64)
		if err != nil || amount < 0 {
			return nil, usagef("--%s: amount %q of %s is not a non-negative integer", flagName, value, name)
		}
		if amount > int64(ledger.MaxUnits) {
			// The largest amount a command may carry; the server would
			// refuse it.
			return nil, usagef("--%s: amount %d of %s: want 0 to %d", flagName, amount, name, int64(ledger.MaxUnits))
		}
		if _, dup := units[name]; dup {
			return nil, usagef("--%s: unit %s given twice", flagName, name)
		}
		units[name] = amount
	}
	return units, nil
}

// connectionFailed reports whether err is connect-go's word for a call
// whose HTTP request failed on its connection (unavailable, made up by the
// client, not a server's answer). connect-go drops the *url.Error around
// such a failure, e.g. "http2: client conn could not be established" when
// a server closed the connection after the handshake, as one that refuses
// the client's certificate does.
func connectionFailed(err error) bool {
	return connect.CodeOf(err) == connect.CodeUnavailable && !connect.IsWireError(err)
}

// certRefused words a failed command whose connection a server refused
// for want of a client certificate it accepts: exit 1 with what to pass.
// The commands that call through the SDK or grpc-go (bench, shard
// reconcile --dir) would otherwise report such a refusal as an
// unavailable server. err is taken for one when it carries the server's
// alert, or when a server asked for a certificate this command could not
// give (env.certUnmet) and err is a failure on a connection it opened (not
// an answer, and not a connection that never opened: notConnected).
func certRefused(e *env, err error) error {
	if !clientCertificateRefused(err) {
		if e.certUnmet == nil || !e.certUnmet.Load() {
			return err
		}
		var urlErr *url.Error
		if (!errors.As(err, &urlErr) && status.Code(err) != codes.Unavailable && !connectionFailed(err)) || notConnected(err) {
			return err
		}
	}
	if strings.Contains(err.Error(), clientCertificateHint) {
		return err // worded by describe
	}
	return exitError{code: exitUsage, err: fmt.Errorf("%w; %s", &clientCertError{err: err}, clientCertificateHint)}
}
