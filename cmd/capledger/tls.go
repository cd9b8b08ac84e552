package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// tlsCheckInterval is how often serve looks at the certificate files for a
// rotation: two stat calls at most this often, on the path of a TLS
// handshake.
const tlsCheckInterval = 2 * time.Second

// certReloader hands the TLS stack the certificate pair at certPath and
// keyPath, and re-reads the pair when either file's modification time or
// size changed since the last attempt, so a certificate can be rotated
// (by cert-manager, certbot, a Kubernetes secret volume) without a
// restart. A pair that fails to load (unreadable, not PEM, key does not
// match) is logged once and the previous certificate stays in service.
type certReloader struct {
	certPath, keyPath string
	interval          time.Duration
	log               *slog.Logger
	now               func() time.Time // time.Now; a test's clock

	cert      atomic.Pointer[tls.Certificate]
	nextCheck atomic.Int64 // UnixNano before which no handshake looks at the files

	mu sync.Mutex // held by the one handshake that checks the files
	// attempted is the state of the files when they were last read,
	// successfully or not: a failed pair is not re-read (nor warned about
	// again) until it changes.
	attempted fileStates
}

// fileStates is what a rotation changes: both files' modification times
// and sizes (size too because some file systems keep mtimes in whole
// seconds), or the error that stat returned.
type fileStates struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
	statErr           string
}

// newCertReloader loads the pair and returns a reloader serving it, or an
// error naming the files when they cannot be read or the key does not
// match the certificate.
func newCertReloader(certPath, keyPath string, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certPath: certPath, keyPath: keyPath, interval: tlsCheckInterval, log: log, now: time.Now}
	states := r.stat()
	if states.statErr != "" {
		return nil, errors.New(states.statErr)
	}
	cert, err := r.load()
	if err != nil {
		return nil, err
	}
	r.attempted = states
	r.cert.Store(cert)
	r.nextCheck.Store(r.now().Add(r.interval).UnixNano())
	return r, nil
}

// stat returns the files' current states. It stats before load reads, so
// a file replaced during the read has a newer state than the one recorded
// and is read again at the next check.
func (r *certReloader) stat() fileStates {
	var s fileStates
	certInfo, err := os.Stat(r.certPath)
	if err != nil {
		s.statErr = fmt.Sprintf("--tls-cert: %v", err)
		return s
	}
	keyInfo, err := os.Stat(r.keyPath)
	if err != nil {
		s.statErr = fmt.Sprintf("--tls-key: %v", err)
		return s
	}
	s.certMod, s.certSize = certInfo.ModTime(), certInfo.Size()
	s.keyMod, s.keySize = keyInfo.ModTime(), keyInfo.Size()
	return s
}

// load reads and checks the pair: it returns the certificate with its
// parsed leaf, or an error naming both files (tls says "private key does
// not match public key" for a mismatched pair).
func (r *certReloader) load() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(r.certPath, r.keyPath)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s with --tls-key %s: %w", r.certPath, r.keyPath, err)
	}
	if cert.Leaf == nil { // LoadX509KeyPair fills it unless GODEBUG x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("--tls-cert %s: %w", r.certPath, err)
		}
	}
	return &cert, nil
}

// GetCertificate is tls.Config.GetCertificate: it returns the current
// certificate, first re-reading the files if the check interval has passed
// and they changed. Handshakes that arrive while one of them checks do not
// wait for it: they get the current certificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := r.now()
	if now.UnixNano() >= r.nextCheck.Load() && r.mu.TryLock() {
		r.nextCheck.Store(now.Add(r.interval).UnixNano())
		r.reloadIfChanged()
		r.mu.Unlock()
	}
	return r.cert.Load(), nil
}

// reloadIfChanged re-reads the pair when the files' state differs from the
// last attempt. Caller holds r.mu.
func (r *certReloader) reloadIfChanged() {
	states := r.stat()
	if states == r.attempted {
		return
	}
	r.attempted = states
	if states.statErr != "" {
		r.log.Warn("tls certificate not reloaded: keeping the previous one", "err", states.statErr)
		return
	}
	cert, err := r.load()
	if err != nil {
		// Writing the two files is not atomic: a check between the
		// writes sees a mismatched pair, and the next one (after the
		// second write) loads it.
		r.log.Warn("tls certificate not reloaded: keeping the previous one", "err", err)
		return
	}
	r.cert.Store(cert)
	r.log.Info("tls certificate reloaded", certAttrs(cert.Leaf)...)
}

// certAttrs describes a certificate for the log.
func certAttrs(leaf *x509.Certificate) []any {
	return []any{"subject", leaf.Subject.String(), "serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339)}
}

// serverTLSConfig returns serve's TLS settings: TLS 1.2 or newer, the
// reloader's certificate, and with clientCAs a client certificate one of
// them signed required in every handshake (mTLS). http.Server adds the
// ALPN protocols (h2 for gRPC, http/1.1) from its Protocols.
func serverTLSConfig(r *certReloader, clientCAs *x509.CertPool) *tls.Config {
	config := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
	if clientCAs != nil {
		config.ClientAuth, config.ClientCAs = tls.RequireAndVerifyClientCert, clientCAs
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

// loadCAPool returns a pool of the PEM certificates in path, or an error
// when the file cannot be read or holds no certificate.
func loadCAPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}
