package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
)

func TestResolverConfigIsCheckedFieldByField(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ok.secret"), []byte("  sixteen-bytes-or-more\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "short.secret"), []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(body string) string {
		path := filepath.Join(dir, "resolver.json")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cfg, err := loadResolverConfig(write(`{"interval":"2s","maxBackoff":"30s","maxInFlight":12,"routes":{
		"chat.generate":{"statusUrl":"https://gw:8443/base","secretFile":"ok.secret","unknownDeadline":"30m"},
		"*":{"unknownDeadline":"1h"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.opts.Interval != 2*time.Second || cfg.opts.MaxBackoff != 30*time.Second || cfg.opts.MaxInFlight != 12 || cfg.opts.Source == nil {
		t.Fatalf("options %+v", cfg.opts)
	}
	chat := &ledger.Reservation{Account: ledger.AccountKey{Route: "chat.generate"}}
	other := &ledger.Reservation{Account: ledger.AccountKey{Route: "embed"}}
	if cfg.opts.Deadline(chat) != 30*time.Minute || cfg.opts.Deadline(other) != time.Hour {
		t.Fatalf("deadlines %v %v", cfg.opts.Deadline(chat), cfg.opts.Deadline(other))
	}
	if c := cfg.route(chat).client; c == nil || string(c.Secret) != "sixteen-bytes-or-more" || c.Base != "https://gw:8443/base" {
		t.Fatalf("chat endpoint %+v", c)
	}
	if _, err := cfg.OperationStatus(t.Context(), other); !errors.Is(err, engine.ErrNoStatusEndpoint) {
		t.Fatalf("route without an endpoint: %v", err)
	}

	for _, c := range []struct{ body, want string }{
		{`{"routes":{}}`, "no routes"},
		{`{"routes":{"r":{}}, "extra":1}`, `line 1: field "extra": no such field; the fields here: interval, maxBackoff, maxInFlight, minBackoff, routes, timeout`},
		{"{\"routes\": {\n  \"r\": {\"deadline\": \"1h\"}\n}}", `line 2: routes.r: field "deadline": no such field; the fields here: secretFile, statusUrl, unknownDeadline`},
		{`{"interval":"soon","routes":{"r":{}}}`, "interval"},
		{`{"timeout":"-1s","routes":{"r":{}}}`, "timeout"},
		{`{"routes":{"r":{"unknownDeadline":"0s"}}}`, "unknownDeadline"},
		{`{"routes":{"r":{"statusUrl":"ftp://gw","secretFile":"ok.secret"}}}`, "statusUrl"},
		{`{"routes":{"r":{"statusUrl":"http://gw"}}}`, "needs a secretFile"},
		{`{"routes":{"r":{"secretFile":"ok.secret"}}}`, "without statusUrl"},
		{`{"routes":{"r":{"statusUrl":"http://gw","secretFile":"short.secret"}}}`, "at least 16"},
		{`{"routes":{"r":{"statusUrl":"http://gw","secretFile":"missing.secret"}}}`, "missing.secret"},
		{`{"routes":{"":{}}}`, "empty route"},
		{`{"maxInFlight":0,"routes":{"r":{}}}`, "maxInFlight 0: want a positive integer"},
		{`{"maxInFlight":-3,"routes":{"r":{}}}`, "maxInFlight -3: want a positive integer"},
		{`{"maxInFlight":"12","routes":{"r":{}}}`, `maxInFlight "12": want a positive integer`},
		{`{"maxInFlight":1.5,"routes":{"r":{}}}`, "maxInFlight 1.5: want a positive integer"},
		{`{"maxInFlight":null,"routes":{"r":{}}}`, "maxInFlight null: want a positive integer"},
		{`{"maxCalls":12,"routes":{"r":{}}}`, `field "maxCalls": no such field`},
		// encoding/json reads a key in another case as the field: refused,
		// naming the key as written and the spelling.
		{`{"maxInflight":12,"routes":{"r":{}}}`, `field "maxInflight": no such field; the field is spelt "maxInFlight"`},
		{`{"routes":{"r":{"UnknownDeadline":"1h"}}}`, `routes.r: field "UnknownDeadline": no such field; the field is spelt "unknownDeadline"`},
		{`{"minBackoff":"2m","maxBackoff":"1m","routes":{"r":{}}}`, "below minBackoff"},
		// Below the default minBackoff (1s): the engine would have raised it to 1m.
		{`{"maxBackoff":"500ms","routes":{"r":{}}}`, "maxBackoff 500ms is below minBackoff 1s"},
		// The question's path would land in the fragment (GET / instead).
		{`{"routes":{"r":{"statusUrl":"http://gw/#frag","secretFile":"ok.secret"}}}`, "statusUrl"},
		{`{"routes":{"r":{"statusUrl":"http://gw/base?","secretFile":"ok.secret"}}}`, "statusUrl"},
		// A second object (two files concatenated) was ignored silently.
		{`{"routes":{"r":{}}}{"routes":{"s":{"unknownDeadline":"1h"}}}`, "line 1, column 20: more than one document"},
		// JSON's mistakes, by line and column; a key given twice (the last
		// one was kept without a word).
		{"{\"routes\":{\"r\":{}},\n}", "line 2, column 1: invalid character '}' looking for beginning of object key string (a comma before }: JSON allows no trailing comma)"},
		{`{"interval":"5s","routes":{"r":{}},"interval":"1h"}`, `line 1, column 36: key "interval" given twice`},
	} {
		_, err := loadResolverConfig(write(c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %q", c.body, err, c.want)
		}
	}
}

// A policy file's key spelt in another case than the field's is refused
// naming both, at the top and in a dimension: encoding/json would read
// "HoldTtl" as holdTtl and "Burst" as burst.
func TestPolicyFileKeysAreCaseSensitive(t *testing.T) {
	if _, _, err := parsePolicyFile("", []byte("subject: tenant-7\nroute: chat\nholdTtl: 1h\ndimensions:\n  - unit: tokens\n    burst: 10\n")); err != nil {
		t.Fatalf("a policy file as written: %v", err)
	}
	for _, c := range []struct{ file, want string }{
		{"subject: tenant-7\nroute: chat\nHoldTtl: 1h\ndimensions:\n  - unit: tokens\n    burst: 10\n",
			`field "HoldTtl": no such field; the field is spelt "holdTtl"`},
		{"subject: tenant-7\nroute: chat\ndimensions:\n  - unit: tokens\n    Burst: 10\n",
			`dimensions[0]: field "Burst": no such field; the field is spelt "burst"`},
		{`{"subject":"tenant-7","route":"chat","dimensions":[{"Unit":"tokens","burst":10}]}`,
			`dimensions[0]: field "Unit": no such field; the field is spelt "unit"`},
		// A field it has in no case: where it is, and what is there.
		{"subject: tenant-7\nroute: chat\ndimensions:\n  - unit: tokens\n    burst: 10\n    refill: 5\n",
			`line 6: dimensions[0]: field "refill": no such field; the fields here: burst, maxOverdraft, maxReservation, refillInterval, refillUnits, unit`},
	} {
		if _, _, err := parsePolicyFile("", []byte(c.file)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.file, err, c.want)
		}
	}
}
