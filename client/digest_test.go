package client

import (
	"strings"
	"testing"
)

// The worked example of docs/CLIENTS.md: a client in another language must
// produce exactly this digest for this input.
var workedExample = DigestInput{
	Subject:         "tenant-7",
	Route:           "chat.generate",
	Region:          "eu-west",
	Units:           Units{"tokens": 600, "requests": 1},
	EstimatorDigest: "sha256:e57",
	BodyHash:        "sha256:b0d",
}

const workedExampleDigest = "sha256:7549e55c2efef44af21d83998bf0e6ce35a291f4ed43a77d49a59f85c1057527"

func TestRequestDigestWorkedExample(t *testing.T) {
	got, err := RequestDigest(workedExample)
	if err != nil {
		t.Fatal(err)
	}
	if got != workedExampleDigest {
		t.Fatalf("digest of the worked example = %s, docs say %s", got, workedExampleDigest)
	}
}

func TestRequestDigestCanonicalForm(t *testing.T) {
	base, err := RequestDigest(workedExample)
	if err != nil {
		t.Fatal(err)
	}
	same := func(name string, in DigestInput) {
		t.Helper()
		d, err := RequestDigest(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d != base {
			t.Errorf("%s: digest %s differs from %s", name, d, base)
		}
	}
	differs := func(name string, in DigestInput) {
		t.Helper()
		d, err := RequestDigest(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d == base {
			t.Errorf("%s: a changed request has the same digest", name)
		}
	}
	with := func(f func(*DigestInput)) DigestInput {
		in := workedExample
		in.Units = Units{"tokens": 600, "requests": 1}
		f(&in)
		return in
	}
	same("zero units left out", with(func(in *DigestInput) { in.Units["images"] = 0 }))
	differs("subject", with(func(in *DigestInput) { in.Subject = "tenant-8" }))
	differs("route", with(func(in *DigestInput) { in.Route = "chat.embed" }))
	differs("region", with(func(in *DigestInput) { in.Region = "us-east" }))
	differs("amount", with(func(in *DigestInput) { in.Units["tokens"] = 601 }))
	differs("extra unit", with(func(in *DigestInput) { in.Units["images"] = 1 }))
	differs("estimator", with(func(in *DigestInput) { in.EstimatorDigest = "sha256:e58" }))
	differs("body", with(func(in *DigestInput) { in.BodyHash = "sha256:b0e" }))
	// Length prefixes: moving bytes between fields changes the digest.
	differs("field boundary", with(func(in *DigestInput) { in.Subject, in.Route = "tenant-7c", "hat.generate" }))

	// Map order never matters (Go randomises iteration on every range).
	for i := 0; i < 50; i++ {
		same("map order", with(func(in *DigestInput) {}))
	}

	emptyRegion, _ := RequestDigest(DigestInput{Subject: "s", Route: "r", Units: Units{"t": 1}})
	globalRegion, _ := RequestDigest(DigestInput{Subject: "s", Route: "r", Region: "global", Units: Units{"t": 1}})
	if emptyRegion != globalRegion {
		t.Errorf("empty region and \"global\" digest differently")
	}
	if !strings.HasPrefix(base, "sha256:") || len(base) != len("sha256:")+64 {
		t.Errorf("digest %q is not sha256:<64 hex>", base)
	}
}

func TestRequestDigestRejectsBadInput(t *testing.T) {
	for name, in := range map[string]DigestInput{
		"no subject":      {Route: "r", Units: Units{"t": 1}},
		"no route":        {Subject: "s", Units: Units{"t": 1}},
		"negative amount": {Subject: "s", Route: "r", Units: Units{"t": -1}},
	} {
		if d, err := RequestDigest(in); err == nil {
			t.Errorf("%s: digest %s, want an error", name, d)
		}
	}
}

func TestBodyHash(t *testing.T) {
	// SHA-256 of the empty string.
	if got := BodyHash(nil); got != "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Fatalf("BodyHash(nil) = %s", got)
	}
}
