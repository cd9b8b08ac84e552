package main

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// tlsCheckInterval is how often serve looks at the TLS files (certificate
// pair, client CA bundle) for a rotation: a stat per file at most this
// often, on the path of a TLS handshake.
const tlsCheckInterval = 2 * time.Second

// fileReloader hands the TLS stack a value loaded from files (the
// certificate pair, the client CA bundle), and re-reads them when any
// file's modification time or size changed since the last attempt, so it
// can be rotated (by cert-manager, certbot, a Kubernetes secret volume)
// without a restart. Files that fail to load (unreadable, not PEM, key does
// not match) are logged once per change and the previous value stays in
// service. It is the one rotation rule for every TLS file serve reads.
type fileReloader[T any] struct {
	what     string // the log messages' subject: "tls certificate reloaded"
	files    []watchedFile
	load     func() (*T, error)
	describe func(*T) []any // the reload log line's attributes
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time // time.Now; a test's clock

	current   atomic.Pointer[T]
	nextCheck atomic.Int64 // UnixNano before which no handshake looks at the files

	mu sync.Mutex // held by the one handshake that checks the files
	// attempted is the state of the files when they were last read,
	// successfully or not: files that failed are not re-read (nor warned
	// about again) until they change.
	attempted fileStates
}

// watchedFile is one file a fileReloader reads, with the flag that named
// it (for the errors).
type watchedFile struct{ flag, path string }

// fileStates is what a rotation changes: each file's modification time
// and size (size too because some file systems keep mtimes in whole
// seconds), or the error that stat returned.
type fileStates struct {
	files   []fileState
	statErr string
}

type fileState struct {
	mod  time.Time
	size int64
}

func (s fileStates) equal(o fileStates) bool {
	return s.statErr == o.statErr && slices.Equal(s.files, o.files)
}

// newFileReloader loads the files and returns a reloader serving the
// value, or the error of stat (naming the flag) or of load.
func newFileReloader[T any](what string, files []watchedFile, load func() (*T, error), describe func(*T) []any, log *slog.Logger) (*fileReloader[T], error) {
	r := &fileReloader[T]{what: what, files: files, load: load, describe: describe, interval: tlsCheckInterval, log: log, now: time.Now}
	states := r.stat()
	if states.statErr != "" {
		return nil, errors.New(states.statErr)
	}
	value, err := r.load()
	if err != nil {
		return nil, err
	}
	r.attempted = states
	r.current.Store(value)
	r.nextCheck.Store(r.now().Add(r.interval).UnixNano())
	return r, nil
}

// stat returns the files' current states. It stats before load reads, so
// a file replaced during the read has a newer state than the one recorded
// and is read again at the next check.
func (r *fileReloader[T]) stat() fileStates {
	s := fileStates{files: make([]fileState, len(r.files))}
	for i, f := range r.files {
		info, err := os.Stat(f.path)
		if err != nil {
			return fileStates{statErr: fmt.Sprintf("%s: %v", f.flag, err)}
		}
		s.files[i] = fileState{mod: info.ModTime(), size: info.Size()}
	}
	return s
}

// Current returns the value in service, first re-reading the files if the
// check interval has passed and they changed. Handshakes that arrive while
// one of them checks do not wait for it: they get the current value.
func (r *fileReloader[T]) Current() *T {
	now := r.now()
	if now.UnixNano() >= r.nextCheck.Load() && r.mu.TryLock() {
		r.nextCheck.Store(now.Add(r.interval).UnixNano())
		r.reloadIfChanged()
		r.mu.Unlock()
	}
	return r.current.Load()
}

// reloadIfChanged re-reads the files when their state differs from the
// last attempt. Caller holds r.mu.
func (r *fileReloader[T]) reloadIfChanged() {
	states := r.stat()
	if states.equal(r.attempted) {
		return
	}
	r.attempted = states
	notReloaded := r.what + " not reloaded: keeping the previous one"
	if states.statErr != "" {
		r.log.Warn(notReloaded, "err", states.statErr)
		return
	}
	value, err := r.load()
	if err != nil {
		// Writing two files (certificate and key) is not atomic: a
		// check between the writes sees a mismatched pair, and the next
		// one (after the second write) loads it.
		r.log.Warn(notReloaded, "err", err)
		return
	}
	r.current.Store(value)
	r.log.Info(r.what+" reloaded", r.describe(value)...)
}

// certReloader serves the certificate pair at --tls-cert and --tls-key.
type certReloader struct{ *fileReloader[tls.Certificate] }

// newCertReloader loads the pair and returns a reloader serving it, or an
// error naming the files when they cannot be read or the key does not
// match the certificate.
func newCertReloader(certPath, keyPath string, log *slog.Logger) (*certReloader, error) {
	load := func() (*tls.Certificate, error) { return loadCertPair(certPath, keyPath) }
	describe := func(cert *tls.Certificate) []any { return certAttrs(cert.Leaf) }
	r, err := newFileReloader("tls certificate", []watchedFile{{"--tls-cert", certPath}, {"--tls-key", keyPath}}, load, describe, log)
	if err != nil {
		return nil, err
	}
	return &certReloader{r}, nil
}

// GetCertificate is tls.Config.GetCertificate: the current certificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.Current(), nil
}

// loadCertPair reads and checks the pair: it returns the certificate with
// its parsed leaf, or an error naming both files (tls says "private key
// does not match public key" for a mismatched pair).
func loadCertPair(certPath, keyPath string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s with --tls-key %s: %w", certPath, keyPath, err)
	}
	if cert.Leaf == nil { // LoadX509KeyPair fills it unless GODEBUG x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("--tls-cert %s: %w", certPath, err)
		}
	}
	return &cert, nil
}

// certAttrs describes a certificate for the log.
func certAttrs(leaf *x509.Certificate) []any {
	return []any{"subject", leaf.Subject.String(), "serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339)}
}

// clientCAReloader serves the CA bundle at --tls-client-ca.
type clientCAReloader struct{ *fileReloader[caBundle] }

// newClientCAReloader loads the bundle and returns a reloader serving it,
// or an error naming the flag when it cannot be read or holds no PEM
// certificate.
func newClientCAReloader(path string, log *slog.Logger) (*clientCAReloader, error) {
	load := func() (*caBundle, error) {
		b, err := loadCABundle(path)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		return b, nil
	}
	r, err := newFileReloader("tls client ca", []watchedFile{{"--tls-client-ca", path}}, load, (*caBundle).attrs, log)
	if err != nil {
		return nil, err
	}
	return &clientCAReloader{r}, nil
}

// serverTLSConfig returns serve's TLS settings: TLS 1.2 or newer, ALPN h2
// (for gRPC) and http/1.1, the reloader's certificate, and with clientCAs
// a client certificate one of the current bundle's CAs signed required in
// every handshake (mTLS).
//
// The bundle is swapped by GetConfigForClient, which hands each handshake
// a copy of these settings with the current bundle's pool as ClientCAs
// (crypto/tls reads a Config's fields during handshakes, so they cannot
// change in place). The copy is taken of a private template, not of the
// returned Config, which net/http and server.Front may adjust. A resumed
// session is accepted only if its client chain still ends in the current
// pool (crypto/tls checks it against ClientCAs), so a CA removed from the
// bundle refuses its clients' resumed sessions too.
func serverTLSConfig(certs *certReloader, clientCAs *clientCAReloader) *tls.Config {
	template := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate, NextProtos: []string{"h2", "http/1.1"}}
	if clientCAs == nil {
		return template
	}
	template.ClientAuth = tls.RequireAndVerifyClientCert
	type forPool struct {
		pool   *x509.CertPool
		config *tls.Config
	}
	var last atomic.Pointer[forPool] // one Config per bundle, not per handshake
	config := template.Clone()
	config.ClientCAs = clientCAs.current.Load().pool
	config.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool := clientCAs.Current().pool
		if l := last.Load(); l != nil && l.pool == pool {
			return l.config, nil
		}
		c := template.Clone()
		c.ClientCAs = pool
		last.Store(&forPool{pool, c})
		return c, nil
	}
	return config
}

// tlsServerErrorLog returns http.Server.ErrorLog for serve over TLS. It
// logs a failed handshake at debug level, everything else at warn as
// server.HTTPServer does: on a port other machines reach, every TCP health
// check of a load balancer and every port scan is a failed handshake, and
// at warn they would bury the lines that matter. A client refusing the
// certificate ("remote error: tls: bad certificate") shows with
// --log-level debug.
func tlsServerErrorLog(logger *slog.Logger) *log.Logger {
	return log.New(serverErrorWriter{logger}, "", 0)
}

type serverErrorWriter struct{ log *slog.Logger }

func (w serverErrorWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		w.log.Debug(msg)
	} else {
		w.log.Warn(msg)
	}
	return len(p), nil
}

// caBundle is a PEM file of CA certificates.
type caBundle struct {
	pool  *x509.CertPool
	certs []*x509.Certificate
}

// loadCAPool returns a pool of the PEM certificates in path, or an error
// when the file cannot be read or holds no certificate.
func loadCAPool(path string) (*x509.CertPool, error) {
	b, err := loadCABundle(path)
	if err != nil {
		return nil, err
	}
	return b.pool, nil
}

// loadCABundle returns the PEM certificates in path, or an error when the
// file cannot be read or holds no certificate. It skips what
// x509.CertPool.AppendCertsFromPEM skips: other blocks, blocks with
// headers, certificates that do not parse.
func loadCABundle(path string) (*caBundle, error) {
	rest, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b := &caBundle{pool: x509.NewCertPool()}
	for len(rest) > 0 {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue
		}
		b.pool.AddCert(cert)
		b.certs = append(b.certs, cert)
	}
	if len(b.certs) == 0 {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return b, nil
}

// maxLoggedCAs bounds the CAs a log line names, for a bundle as large as
// a system's roots.
const maxLoggedCAs = 8

// attrs describes the bundle for the log: how many certificates, and the
// subject and the start of the SHA-256 fingerprint of each of the first
// maxLoggedCAs (a rotated CA often keeps its predecessor's name).
func (b *caBundle) attrs() []any {
	var cas []string
	for i, cert := range b.certs {
		if i == maxLoggedCAs {
			cas = append(cas, fmt.Sprintf("and %d more", len(b.certs)-i))
			break
		}
		sum := sha256.Sum256(cert.Raw)
		cas = append(cas, fmt.Sprintf("%s (sha256 %x)", cert.Subject, sum[:8]))
	}
	return []any{"certificates", len(b.certs), "cas", strings.Join(cas, "; ")}
}
