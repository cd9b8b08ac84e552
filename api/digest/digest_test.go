package digest

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// The worked example of docs/CLIENTS.md; client.TestRequestDigestWorkedExample
// pins the same value through the SDK's wrapper.
var workedExample = Input{
	Subject:         "tenant-7",
	Route:           "chat.generate",
	Region:          "eu-west",
	Units:           map[string]int64{"tokens": 600, "requests": 1},
	EstimatorDigest: "sha256:e57",
	BodyHash:        "sha256:b0d",
}

const workedExampleDigest = "sha256:7549e55c2efef44af21d83998bf0e6ce35a291f4ed43a77d49a59f85c1057527"

func TestWorkedExample(t *testing.T) {
	got, err := Request(workedExample)
	if err != nil {
		t.Fatal(err)
	}
	if got != workedExampleDigest {
		t.Fatalf("digest of the worked example = %s, docs/CLIENTS.md says %s", got, workedExampleDigest)
	}
}

// The second example of docs/CLIENTS.md: a subject with a combining accent
// (not normalised) and unit names whose UTF-8 byte order differs from their
// UTF-16 code-unit order (U+1F600 sorts after U+FF5A here, before it in
// Java's or JavaScript's default string order). Left empty, the region is
// "global", and estimator digest and body hash are empty: the digest the
// server derives for a Reserve without one.
var unicodeExample = Input{
	Subject: "te\u0301nant-7",
	Route:   "chat.generate",
	Units:   map[string]int64{"\uff5a": 1, "\U0001F600": 2, "e\u0301": 3, "\u00e9": 4},
}

const unicodeExampleDigest = "sha256:4550ecd93ed99cf11c86161a336c70ccde004d0aeb5fcfb73481ecd42b5f7566"

func TestUnicodeExample(t *testing.T) {
	got, err := Request(unicodeExample)
	if err != nil {
		t.Fatal(err)
	}
	if got != unicodeExampleDigest {
		t.Fatalf("digest of the Unicode example = %s, want %s", got, unicodeExampleDigest)
	}
	precomposed := unicodeExample
	precomposed.Subject = "t\u00e9nant-7"
	if other, _ := Request(precomposed); other == got {
		t.Fatalf("the precomposed and the combining spelling of the subject gave one digest %s: strings must not be normalised", got)
	}
}

// TestDocumentedDigests checks that docs/CLIENTS.md shows the digests these
// tests pin, so a client author reads the values the server computes.
func TestDocumentedDigests(t *testing.T) {
	doc, err := os.ReadFile("../../docs/CLIENTS.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, digest := range map[string]string{"worked example": workedExampleDigest, "second example": unicodeExampleDigest} {
		if !strings.Contains(string(doc), "\n"+digest+"\n") {
			t.Errorf("docs/CLIENTS.md does not show the %s's digest %s", name, digest)
		}
	}
}

// The README's walkthrough reserves without a digest, so the server derives
// this one (no estimator, no body hash); pinning it keeps the README's
// printed receipts true.
const walkthroughDigest = "sha256:d17f8a143e11f40df35017e6fbd1cba43640c29b6ddf087a34367ef32184c66f"

func TestServerDerivedForm(t *testing.T) {
	got, err := Request(Input{Subject: "tenant-7", Route: "chat.generate",
		Units: map[string]int64{"tokens": 600, "requests": 1}})
	if err != nil {
		t.Fatal(err)
	}
	withRegion, err := Request(Input{Subject: "tenant-7", Route: "chat.generate", Region: "global",
		Units: map[string]int64{"requests": 1, "tokens": 600, "images": 0}})
	if err != nil {
		t.Fatal(err)
	}
	if got != walkthroughDigest {
		t.Fatalf("derived digest of the README walkthrough = %s, README says %s", got, walkthroughDigest)
	}
	if got != withRegion {
		t.Fatalf("empty region / zero unit changed the digest: %s vs %s", got, withRegion)
	}
	if !strings.HasPrefix(got, "sha256:") || len(got) != len("sha256:")+64 {
		t.Fatalf("digest %q is not sha256:<64 hex>", got)
	}
}

func TestInvalidInput(t *testing.T) {
	for name, in := range map[string]Input{
		"no subject":      {Route: "r", Units: map[string]int64{"t": 1}},
		"no route":        {Subject: "s", Units: map[string]int64{"t": 1}},
		"negative amount": {Subject: "s", Route: "r", Units: map[string]int64{"t": -1}},
	} {
		d, err := Request(in)
		if err == nil {
			t.Errorf("%s: digest %s, want an error", name, d)
			continue
		}
		if !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: error %v does not wrap ErrInvalidInput", name, err)
		}
	}
}

func TestBodyHash(t *testing.T) {
	// SHA-256 of the empty string.
	if got := BodyHash(nil); got != "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Fatalf("BodyHash(nil) = %s", got)
	}
}
