package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
)

// resolverFile is the JSON of serve --resolver-config: the scan's timing,
// the bound on status calls out at once across routes, and per route the
// operation-status endpoint of its gateways, the shared secret that
// authenticates it (docs/CLIENTS.md), and the unknownDeadline past which
// USAGE_UNKNOWN work is flagged for an operator. Route "*" applies to
// routes not named. It is server configuration, not policy: an endpoint
// URL and a secret are deployment facts that change without changing any
// accounting term, must not mint a policy generation, and must not be
// readable by every token that may read policies.
type resolverFile struct {
	Interval   string `json:"interval,omitempty"`
	MinBackoff string `json:"minBackoff,omitempty"`
	MaxBackoff string `json:"maxBackoff,omitempty"`
	Timeout    string `json:"timeout,omitempty"`
	// MaxInFlight is raw so that a wrong type is refused with the
	// field's name in the same words as a 0 or a negative number.
	MaxInFlight json.RawMessage              `json:"maxInFlight,omitempty"`
	Routes      map[string]resolverRouteFile `json:"routes"`
}

type resolverRouteFile struct {
	StatusURL       string `json:"statusUrl,omitempty"`
	SecretFile      string `json:"secretFile,omitempty"`
	UnknownDeadline string `json:"unknownDeadline,omitempty"`
}

// minSecretBytes is the shortest shared secret accepted.
const minSecretBytes = 16

type resolverRoute struct {
	client   *opstatus.Client // nil: no endpoint
	deadline time.Duration
}

// resolverConfig is a loaded --resolver-config.
type resolverConfig struct {
	opts   engine.ResolverOptions
	routes map[string]resolverRoute
}

// loadResolverConfig reads and checks a --resolver-config file; every
// problem is an error naming the field.
func loadResolverConfig(path string) (*resolverConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("resolver config: %w", err)
	}
	var f resolverFile
	if err := decodeStrictJSON(raw, &f); err != nil {
		return nil, fmt.Errorf("resolver config %s: %w", path, err)
	}
	if len(f.Routes) == 0 {
		return nil, fmt.Errorf("resolver config %s: no routes", path)
	}
	cfg := &resolverConfig{routes: map[string]resolverRoute{}}
	durations := []struct {
		name string
		text string
		into *time.Duration
	}{
		{"interval", f.Interval, &cfg.opts.Interval}, {"minBackoff", f.MinBackoff, &cfg.opts.MinBackoff},
		{"maxBackoff", f.MaxBackoff, &cfg.opts.MaxBackoff}, {"timeout", f.Timeout, &cfg.opts.CallTimeout},
	}
	for _, d := range durations {
		if d.text == "" {
			continue
		}
		v, err := time.ParseDuration(d.text)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("resolver config %s: %s %q: want a positive duration like \"5s\"", path, d.name, d.text)
		}
		*d.into = v
	}
	// A maxBackoff below the default minBackoff is refused too: the engine
	// would otherwise raise it to a minute, the opposite of what was asked.
	if minBackoff := cmp.Or(cfg.opts.MinBackoff, engine.DefaultResolverMinBackoff); cfg.opts.MaxBackoff > 0 && cfg.opts.MaxBackoff < minBackoff {
		return nil, fmt.Errorf("resolver config %s: maxBackoff %v is below minBackoff %v", path, cfg.opts.MaxBackoff, minBackoff)
	}
	if f.MaxInFlight != nil {
		var n int
		if err := json.Unmarshal(f.MaxInFlight, &n); err != nil || n <= 0 {
			return nil, fmt.Errorf("resolver config %s: maxInFlight %s: want a positive integer like %d (status calls out at once across routes)",
				path, f.MaxInFlight, engine.DefaultResolverMaxInFlight)
		}
		cfg.opts.MaxInFlight = n
	}
	timeout := cfg.opts.CallTimeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	httpClient := &http.Client{Timeout: timeout}
	for route, rf := range f.Routes {
		if route == "" {
			return nil, fmt.Errorf("resolver config %s: empty route name (use \"*\" for every route)", path)
		}
		var rr resolverRoute
		if rf.UnknownDeadline != "" {
			d, err := time.ParseDuration(rf.UnknownDeadline)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("resolver config %s: route %s: unknownDeadline %q: want a positive duration like \"30m\"", path, route, rf.UnknownDeadline)
			}
			rr.deadline = d
		}
		switch {
		case rf.StatusURL == "" && rf.SecretFile != "":
			return nil, fmt.Errorf("resolver config %s: route %s: secretFile without statusUrl", path, route)
		case rf.StatusURL != "":
			u, err := url.Parse(rf.StatusURL)
			// The question's path is appended to statusUrl: after a query or a
			// fragment it would not be the path asked.
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(rf.StatusURL, "?#") {
				return nil, fmt.Errorf("resolver config %s: route %s: statusUrl %q: want http(s)://host[:port][/base]", path, route, rf.StatusURL)
			}
			if rf.SecretFile == "" {
				return nil, fmt.Errorf("resolver config %s: route %s: statusUrl needs a secretFile (the endpoint's answers are authenticated with it)", path, route)
			}
			secretPath := rf.SecretFile
			if !filepath.IsAbs(secretPath) {
				secretPath = filepath.Join(filepath.Dir(path), secretPath)
			}
			secret, err := os.ReadFile(secretPath)
			if err != nil {
				return nil, fmt.Errorf("resolver config %s: route %s: %w", path, route, err)
			}
			secret = bytes.TrimSpace(secret)
			if len(secret) < minSecretBytes {
				return nil, fmt.Errorf("resolver config %s: route %s: secret in %s has %d bytes, want at least %d", path, route, secretPath, len(secret), minSecretBytes)
			}
			rr.client = &opstatus.Client{Base: rf.StatusURL, Secret: secret, HTTP: httpClient}
		}
		cfg.routes[route] = rr
	}
	cfg.opts.Source = cfg
	cfg.opts.Deadline = cfg.deadline
	cfg.opts.Seed = uint64(time.Now().UnixNano())
	return cfg, nil
}

func (c *resolverConfig) route(r *ledger.Reservation) resolverRoute {
	if rr, ok := c.routes[r.Account.Route]; ok {
		return rr
	}
	return c.routes["*"]
}

func (c *resolverConfig) deadline(r *ledger.Reservation) time.Duration { return c.route(r).deadline }

// OperationStatus implements engine.OperationStatusSource over the HTTP
// endpoint of the reservation's route.
func (c *resolverConfig) OperationStatus(ctx context.Context, r *ledger.Reservation) (engine.OperationStatus, error) {
	rr := c.route(r)
	if rr.client == nil {
		return engine.OperationStatus{}, engine.ErrNoStatusEndpoint
	}
	res, err := rr.client.Get(ctx, r.ID, r.OperationID)
	if errors.Is(err, opstatus.ErrBadAnswer) {
		return engine.OperationStatus{}, unusable{err}
	}
	if err != nil {
		return engine.OperationStatus{}, err
	}
	switch res.Status {
	case opstatus.StatusFinished:
		return engine.OperationStatus{State: engine.OperationFinished, Units: res.Units}, nil
	case opstatus.StatusNeverStarted:
		return engine.OperationStatus{State: engine.OperationNeverStarted}, nil
	case opstatus.StatusRunning:
		return engine.OperationStatus{State: engine.OperationRunning}, nil
	case opstatus.StatusUnknown:
		return engine.OperationStatus{State: engine.OperationUnknown}, nil
	}
	return engine.OperationStatus{}, unusable{errors.New("operation status: unexpected status " + res.Status)}
}

// unusable marks err, about an answer the endpoint gave, as the
// reservation's own failure for the resolver (engine.ErrUnusableStatusAnswer),
// keeping err's message.
type unusable struct{ err error }

func (e unusable) Error() string   { return e.err.Error() }
func (e unusable) Unwrap() []error { return []error{e.err, engine.ErrUnusableStatusAnswer} }
