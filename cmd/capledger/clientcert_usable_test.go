package main

import (
	"crypto/x509"
	"testing"
	"time"
)

// clientCertUsable is what a server verifying a client certificate, as
// serve --tls-client-ca does (crypto/tls: within validity, client-auth
// usage or none at all, or any), accepts: a certificate it reports
// unusable turns a failed call into "pass --cert" (exit 1) instead of
// the failure it was.
func TestClientCertUsableAsTheServerVerifies(t *testing.T) {
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	valid := func(usage ...x509.ExtKeyUsage) *x509.Certificate {
		return &x509.Certificate{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), ExtKeyUsage: usage}
	}
	for _, tc := range []struct {
		name string
		leaf *x509.Certificate
		want bool
	}{
		{"client auth", valid(x509.ExtKeyUsageClientAuth), true},
		{"no extended key usage", valid(), true},
		{"any usage", valid(x509.ExtKeyUsageAny), true},
		{"server and client auth", valid(x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth), true},
		{"server auth only", valid(x509.ExtKeyUsageServerAuth), false},
		{"expired", &x509.Certificate{NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)}, false},
		{"not yet valid", &x509.Certificate{NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour)}, false},
		{"not parsed", nil, true},
	} {
		if got := clientCertUsable(tc.leaf, now); got != tc.want {
			t.Errorf("%s: usable %v, want %v", tc.name, got, tc.want)
		}
	}
}
