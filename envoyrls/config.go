package envoyrls

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/capledger/capledger/internal/yamlfile"
	"github.com/capledger/capledger/ledger"
)

// Config is the mapping from Envoy's rate limit domains and descriptors to
// capledger's subjects, routes, regions and units (`serve --envoy-config`).
// See docs/ENVOY.md for the file format and an example.
type Config struct {
	// UnknownDescriptor is what a descriptor that maps to no policy gets:
	// "deny" (OVER_LIMIT, the default) or "allow" (OK). A descriptor maps
	// to no policy when its domain is not configured, when no rule of the
	// domain matches its entries, or when no active policy covers the
	// subject, route and region it maps to (or the policy has no dimension
	// of the rule's unit).
	UnknownDescriptor string `json:"unknown_descriptor"`
	// Domains are the Envoy rate limit domains served.
	Domains []Domain `json:"domains"`
}

// Domain is one Envoy rate limit domain (RateLimitRequest.domain).
type Domain struct {
	Name string `json:"name"`
	// Rules are tried in order; the first whose keys match a descriptor
	// maps it.
	Rules []Rule `json:"rules"`
}

// Field takes a value either from a descriptor entry (Key) or fixed
// (Value), never both.
type Field struct {
	Key   string `json:"key,omitempty"`
	Value string `json:"value,omitempty"`
}

// Rule maps one shape of descriptor. A descriptor matches when its entry
// keys are exactly the keys the rule names (subject.key, route.key and
// region.key when set, the keys of Match, and optionally IDKey and
// PhaseKey), and every Match entry has its value.
type Rule struct {
	// Match are entries that must be present with exactly these values
	// (e.g. a generic_key action's descriptor_key: value), telling rules
	// apart; they do not name the capacity.
	Match map[string]string `json:"match,omitempty"`
	// Subject names the subject (required); e.g. {key: tenant}.
	Subject Field `json:"subject"`
	// Route names the route; the domain's name when empty.
	Route Field `json:"route"`
	// Region names the region; ledger.DefaultRegion when empty.
	Region Field `json:"region"`
	// Unit is the policy dimension the hits count in (required).
	Unit string `json:"unit"`
	// IDKey is the entry carrying the reservation id (e.g. x-request-id,
	// put into the descriptor by a request_headers action). Without it,
	// each check is a reserve-and-settle of its hits in one durable step.
	IDKey string `json:"id_key,omitempty"`
	// PhaseKey is the entry that marks the call Envoy makes after the
	// stream (apply_on_stream_done) with the actual usage: its value must
	// be SettleValue. A descriptor without it is a check before the request.
	PhaseKey string `json:"phase_key,omitempty"`
	// SettleOnHits makes a descriptor's hits tell the two calls apart
	// instead of a phase entry: hits > 0 is the call after the stream (as
	// with PhaseKey's settle), hits 0 the check before the request. For
	// gateways that send the same descriptor on both calls, with cost 0 on
	// the request (Envoy Gateway's and Envoy AI Gateway's request and
	// response costs): without it the response's cost is a classic check of
	// its hits, refused and not recorded when it does not fit.
	SettleOnHits bool `json:"settle_on_hits,omitempty"`
	// Estimate is what a check with an id reserves when its hits are 0
	// (an explicit hits_addend of 0, as Envoy AI Gateway sends before the
	// response); 0 makes such a check a probe that reserves nothing.
	Estimate int64 `json:"estimate,omitempty"`
}

// SettleValue is the value of a rule's PhaseKey entry that makes a
// descriptor the settle of the actual usage.
const SettleValue = "settle"

// LoadConfig reads and validates a mapping file.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("envoy config: %w", err)
	}
	c, err := parseConfigFile(path, data)
	if err != nil {
		return nil, fmt.Errorf("envoy config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses and validates a mapping in YAML, or in strict JSON
// when it is JSON ("{" first: yamlfile.IsJSON). Unknown fields are
// errors, so a misspelt key does not silently change the mapping.
func ParseConfig(data []byte) (*Config, error) {
	return parseConfigFile("", data)
}

// parseConfigFile is ParseConfig for the file named name, which is JSON
// also when its name ends in .json.
func parseConfigFile(name string, data []byte) (*Config, error) {
	var c Config
	if err := yamlfile.UnmarshalFile(name, data, &c); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) validate() error {
	switch c.UnknownDescriptor {
	case "":
		c.UnknownDescriptor = "deny"
	case "allow", "deny":
	default:
		return fmt.Errorf("unknown_descriptor is %q; want allow or deny", c.UnknownDescriptor)
	}
	if len(c.Domains) == 0 {
		return errors.New("no domains")
	}
	seen := map[string]bool{}
	for i := range c.Domains {
		d := &c.Domains[i]
		if d.Name == "" {
			return fmt.Errorf("domains[%d]: name is required", i)
		}
		if seen[d.Name] {
			return fmt.Errorf("domain %q appears twice", d.Name)
		}
		seen[d.Name] = true
		if len(d.Rules) == 0 {
			return fmt.Errorf("domain %q: no rules", d.Name)
		}
		for j := range d.Rules {
			if err := d.Rules[j].validate(); err != nil {
				return fmt.Errorf("domain %q rules[%d]: %w", d.Name, j, err)
			}
			for i := range j {
				if d.Rules[i].covers(&d.Rules[j]) {
					return fmt.Errorf("domain %q rules[%d] never matches: rules[%d] before it matches every descriptor it would (the first rule that matches wins); tell them apart with match, or put the narrower rule first", d.Name, j, i)
				}
			}
		}
	}
	return nil
}

func (f Field) validate(name string, required bool) error {
	switch {
	case f.Key != "" && f.Value != "":
		return fmt.Errorf("%s: key and value are exclusive", name)
	case required && f.Key == "" && f.Value == "":
		return fmt.Errorf("%s: key or value is required", name)
	}
	return nil
}

func (r *Rule) validate() error {
	if err := r.Subject.validate("subject", true); err != nil {
		return err
	}
	if r.Subject.Value == ledger.AnySubject {
		return fmt.Errorf("subject value %q names every subject; checks need a concrete one", ledger.AnySubject)
	}
	if err := r.Route.validate("route", false); err != nil {
		return err
	}
	if err := r.Region.validate("region", false); err != nil {
		return err
	}
	if r.Unit == "" {
		return errors.New("unit is required")
	}
	if problem := ledger.TextProblem(r.Unit, ledger.MaxUnitBytes); problem != "" {
		// No policy can have such a unit: every check would be unknown_unit.
		return fmt.Errorf("unit %s (a policy's unit is at most %d bytes)", problem, ledger.MaxUnitBytes)
	}
	if r.Estimate < 0 || r.Estimate > ledger.MaxUnits {
		return fmt.Errorf("estimate %d is outside [0, %d]", r.Estimate, ledger.MaxUnits)
	}
	if r.PhaseKey != "" && r.IDKey == "" {
		// Without an id there is no reservation for the settle to close.
		// A settle-phase descriptor without id is still accepted (a
		// record of the cost after the fact), but a rule that names the
		// phase key and no id key is almost certainly a mistake.
		return errors.New("phase_key needs id_key: the settle closes the reservation the id names")
	}
	if r.Estimate > 0 && r.IDKey == "" {
		// Only a check with an id reserves an estimate: without id_key
		// every check of 0 hits would be a probe, holding nothing, while
		// the file says it reserves.
		return errors.New("estimate needs id_key: only a check with an id reserves the estimate")
	}
	if r.SettleOnHits && r.PhaseKey != "" {
		return errors.New("settle_on_hits and phase_key both say which call settles; use one")
	}
	keys := r.keys()
	for i, k := range keys {
		if k == "" {
			continue
		}
		if slices.Contains(keys[i+1:], k) {
			return fmt.Errorf("entry key %q is used twice", k)
		}
	}
	return nil
}

// covers reports whether r matches every descriptor that b matches, so
// that b, after r, would never map one. It holds when both require the
// same entry keys, each of r's match entries is one of b's with the same
// value (an entry b fixes may be one r reads any value of), b's id and
// phase keys, when set, are r's, and r's subject, when read from an
// entry, is never empty where b matches. It errs on the side of false: a
// rule it does not report may still be unreachable in a way it does not
// see.
func (r *Rule) covers(b *Rule) bool {
	required := func(x *Rule) map[string]bool {
		keys := map[string]bool{}
		for _, k := range []string{x.Subject.Key, x.Route.Key, x.Region.Key} {
			if k != "" {
				keys[k] = true
			}
		}
		for k := range x.Match {
			keys[k] = true
		}
		return keys
	}
	if !maps.Equal(required(r), required(b)) {
		return false
	}
	for k, v := range r.Match {
		if w, ok := b.Match[k]; !ok || w != v {
			return false
		}
	}
	if b.IDKey != "" && b.IDKey != r.IDKey || b.PhaseKey != "" && b.PhaseKey != r.PhaseKey {
		return false
	}
	return r.Subject.Key == "" || r.Subject.Key == b.Subject.Key || b.Match[r.Subject.Key] != ""
}

// keys returns every entry key the rule reads ("" for unset ones).
func (r *Rule) keys() []string {
	keys := []string{r.Subject.Key, r.Route.Key, r.Region.Key, r.IDKey, r.PhaseKey}
	for k := range r.Match {
		keys = append(keys, k)
	}
	return keys
}

// Entry is one descriptor entry.
type Entry struct{ Key, Value string }

// Mapped is one descriptor as the rule that matched it reads it.
type Mapped struct {
	Rule *Rule
	Key  ledger.PolicyKey
	// ID is the request's id ("" when the rule has none or the entry is
	// absent); Settle marks the after-the-stream call.
	ID     string
	Settle bool
}

// Map returns how domain's descriptor of entries maps, or ok false when no
// rule of a configured domain matches it (an unknown descriptor).
func (c *Config) Map(domain string, entries []Entry) (m Mapped, ok bool) {
	for i := range c.Domains {
		if c.Domains[i].Name != domain {
			continue
		}
		for j := range c.Domains[i].Rules {
			if m, ok := c.Domains[i].Rules[j].match(domain, entries); ok {
				return m, true
			}
		}
		return Mapped{}, false
	}
	return Mapped{}, false
}

func (r *Rule) match(domain string, entries []Entry) (Mapped, bool) {
	m := Mapped{Rule: r, Key: ledger.PolicyKey{Subject: r.Subject.Value, Route: r.Route.Value, Region: r.Region.Value}}
	matched := 0
	var seen map[string]bool // only for descriptors of many entries
	if len(entries) > smallEntries {
		seen = make(map[string]bool, len(entries))
	}
	for i, e := range entries {
		// A repeated key is ambiguous: which value names the capacity?
		if e.Key == "" || repeated(entries, i, seen) {
			return Mapped{}, false
		}
		switch {
		case e.Key == r.Subject.Key:
			m.Key.Subject = e.Value
		case e.Key == r.Route.Key:
			m.Key.Route = e.Value
		case e.Key == r.Region.Key:
			m.Key.Region = e.Value
		case e.Key == r.IDKey:
			m.ID = e.Value
			continue
		case e.Key == r.PhaseKey:
			if e.Value != SettleValue {
				return Mapped{}, false
			}
			m.Settle = true
			continue
		default:
			want, ok := r.Match[e.Key]
			if !ok || want != e.Value {
				return Mapped{}, false
			}
		}
		matched++
	}
	need := len(r.Match)
	for _, k := range []string{r.Subject.Key, r.Route.Key, r.Region.Key} {
		if k != "" {
			need++
		}
	}
	// Every required key present (each at most once, above).
	if matched != need || m.Key.Subject == "" {
		return Mapped{}, false
	}
	if m.Key.Route == "" {
		m.Key.Route = domain
	}
	if m.Key.Region == "" {
		m.Key.Region = ledger.DefaultRegion
	}
	return m, true
}

// smallEntries is the most entries a descriptor may have for match to
// look for a repeated key by comparing with the entries before it
// instead of in a map (Envoy's descriptors have a handful).
const smallEntries = 16

// repeated reports whether entries[i]'s key appears before it: by
// comparison when seen is nil (few entries), else in seen, which it
// updates.
func repeated(entries []Entry, i int, seen map[string]bool) bool {
	key := entries[i].Key
	if seen == nil {
		for j := range i {
			if entries[j].Key == key {
				return true
			}
		}
		return false
	}
	if seen[key] {
		return true
	}
	seen[key] = true
	return false
}
