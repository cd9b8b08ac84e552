package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"

	"github.com/capledger/capledger/internal/yamlfile"
	"github.com/capledger/capledger/server"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

func init() {
	register(&command{name: "policy", summary: "publish, get, list and roll back policies (admissionBudget.v1)", help: policyHelp, subs: []subcommand{
		{"publish", runPolicyPublish}, {"get", runPolicyGet}, {"list", runPolicyList}, {"rollback", runPolicyRollback}}})
}

const policyHelp = `Usage:
  capledger policy publish FILE     publish a policy file (YAML or JSON; - for stdin)
  capledger policy get GEN [--format json|yaml]   json (default): the API's record;
                                    yaml: the file form below; both publish again
  capledger policy list [--subject S] [--route R] [--region REGION] [--page-size N]
                                    every generation the filters select (exact
                                    matches), oldest first, as {"policies": [...]};
                                    it follows the API's pages of N (default
                                    1000, at most 1000) and prints each as it
                                    arrives, --timeout bounding each page; if a
                                    page fails the output stops there (not
                                    valid JSON) and the exit code is the error's
  capledger policy rollback GEN     prints activeGeneration (the generation now
                                    active for the key, "0": none) and replayed

A policy (admissionBudget.v1) limits one subject (or every subject, "*") on
one route and region. Each publish creates a new immutable generation that
becomes the active one; the subject's capacity and debt carry over to it.
Publishing the active generation's exact terms again creates nothing.
Rollback stops admission under a generation; the newest earlier one that
was not rolled back becomes active again, and settlement and debt of the
rolled-back one go on. publish and rollback need an admin token.

Policy file (YAML or JSON, one policy per file; durations like "30s", "5m", "1h").
A file whose name ends in .json, or whose first character is { or [
(standard input too), is JSON and read as strict JSON: a trailing comma, a
comment or a key given twice is an error naming its line and column.
Anything else is YAML (write a YAML file in block style, as below).
Field names are those of the API's Policy (docs/API.md, PublishPolicy);
"holdTTL", the spelling of older files, is still read as holdTtl, and a file
giving both is refused. An unknown field, a key spelt in another case than
its field ("Burst" for "burst", "HoldTtl" for "holdTtl"), a key given
twice or a value its field does not take ("burst: 10x") is an error
naming its line and field, and so is a term the server refuses
("maxReservation 11 is outside (0, burst 10]"):

  subject: tenant-7          # or "*" for every subject without its own policy
  route: chat.generate
  region: global             # default global
  rollout: enforce           # enforce (default) or shadow: shadow rejections admit
  holdTtl: 60s               # unstarted reservations expire after this (default 60s)
  executionLimit: 5m         # started work past this becomes USAGE_UNKNOWN (default none)
  epochLength: 1h            # accounting epoch (default 1h; at least 1s)
  estimatorDigest: sha256:71a...   # optional, traces receipts to the estimator (at most 512 bytes)
  priority: 0                # optional, for the fair scheduler
  fairnessWeight: 1          # optional: 1 to 1048576 (default 1)
  fairnessBudget: 0.05       # optional: tolerated fairness error in [0, 1] (default 0.05)
  emergencyMode: false       # optional: may emergency shards be issued
  dimensions:                # one to four units, limited together
    - unit: tokens           # a name of 1 to 128 bytes
      burst: 1000            # capacity ceiling; a new subject starts full
      refillUnits: 100       # minted every refillInterval (0: no refill)
      refillInterval: 1s
      maxReservation: 800    # largest single reservation (default: burst)
      maxOverdraft: 200      # tolerated overuse per settle (default 0)
    - unit: requests
      burst: 10
      refillUnits: 1
      refillInterval: 1s

Example:
  capledger policy publish tenant-7.yaml --token $ADMIN_TOKEN
  capledger policy rollback 3

To edit a live policy, get its active generation, edit, publish:
  capledger policy get 3 --format yaml > tenant-7.yaml
  capledger policy publish tenant-7.yaml --token $ADMIN_TOKEN
What get prints of the active generation publishes unchanged in either
form (a replay of it). Both forms leave out a maxReservation equal to its
burst (the default), so it follows the burst as edited; one below the
burst is written and kept. A file also takes the API's JSON spellings (rollout
ROLLOUT_MODE_SHADOW, int64s as strings: "1000") and ignores the fields the
server sets (publishedAt, active, rolledBack, rolloutNow). Its "generation"
is the one it was edited from: publish refuses it (exit 4, reason
POLICY_GENERATION_CHANGED, nothing published) once that generation is no
longer the active one of its subject, route and region, so a stale copy
cannot undo a newer publish. Get the active generation and edit that, or
delete the generation line to publish the file's terms over it.

` + clientFlagsHelp + "\n" + exitCodesHelp

func runPolicyPublish(ctx context.Context, e *env, args []string) error {
	fs := newFlags("policy publish")
	var cf clientFlags
	cf.register(fs, e)
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(positional, 1, "one policy FILE (- for stdin)"); err != nil {
		return err
	}
	data, err := readInput(positional[0])
	if err != nil {
		return usagef("read policy: %v", err)
	}
	policy, editedFrom, err := parsePolicyFile(positional[0], data)
	if err != nil {
		return usagef("policy %s: %v", positional[0], err)
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.PublishPolicy, &v1.PublishPolicyRequest{Policy: policy, EditedFrom: editedFrom})
	if err != nil {
		if errorDetailReason(err) == server.ReasonGenerationChanged {
			return fmt.Errorf("%w\n%s names generation %d, the one it was edited from: get the active generation and edit that, or delete the generation line to publish the file over it", err, positional[0], editedFrom)
		}
		// A refused term: the message names its path in the request
		// (ErrorDetail.field, policy.dimensions[1].burst); say where the
		// file has it.
		if path, ok := strings.CutPrefix(errorDetail(err).GetField(), "policy."); ok {
			if line := yamlfile.LineOf(data, path); line > 0 {
				return fmt.Errorf("%w\n%s line %d: %s", err, positional[0], line, path)
			}
		}
		return err
	}
	if msg.GetReplayed() {
		fmt.Fprintf(e.stderr, "same terms as active generation %d: nothing new published\n", msg.GetPolicy().GetGeneration())
	}
	return printJSON(e.stdout, msg.GetPolicy())
}

func parseGeneration(positional []string) (uint64, error) {
	if err := wantArgs(positional, 1, "one generation number"); err != nil {
		return 0, err
	}
	generation, err := strconv.ParseUint(positional[0], 10, 64)
	if err != nil || generation == 0 {
		return 0, usagef("generation %q is not a positive integer", positional[0])
	}
	return generation, nil
}

func runPolicyGet(ctx context.Context, e *env, args []string) error {
	fs := newFlags("policy get")
	var cf clientFlags
	cf.register(fs, e)
	format := fs.String("format", "json", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	generation, err := parseGeneration(positional)
	if err != nil {
		return err
	}
	if *format != "json" && *format != "yaml" {
		return usagef("--format %q: want json or yaml", *format)
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.GetPolicy, &v1.GetPolicyRequest{Generation: generation})
	if err != nil {
		return err
	}
	if *format == "yaml" {
		out, err := yaml.Marshal(policyFileOf(msg.GetPolicy()))
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(out)
		return err
	}
	return printJSON(e.stdout, policyRecordToEdit(msg.GetPolicy()))
}

// policyRecordToEdit is p, the API's record, as policy get prints it in
// JSON: every dimension's maxReservation equal to its burst left out, as
// the yaml form leaves it out (writtenMaxReservation), so that a burst
// edited alone in either form is published with the maxReservation
// following it. Publishing the record unchanged is still a replay: the
// server gives a maxReservation left out the burst.
func policyRecordToEdit(p *v1.Policy) *v1.Policy {
	edited := proto.Clone(p).(*v1.Policy)
	for _, d := range edited.GetDimensions() {
		d.MaxReservation = writtenMaxReservation(d)
	}
	return edited
}

// writtenMaxReservation is the maxReservation policy get writes for d: 0
// (left out) when it equals the burst, the default a file that leaves it
// out gets; written, it would pin the old burst, and a file whose burst
// alone was lowered would be refused (maxReservation above burst). One
// below the burst is written.
func writtenMaxReservation(d *v1.Dimension) int64 {
	if d.GetMaxReservation() == d.GetBurst() {
		return 0
	}
	return d.GetMaxReservation()
}

func runPolicyList(ctx context.Context, e *env, args []string) error {
	fs := newFlags("policy list")
	var cf clientFlags
	cf.register(fs, e)
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	pageSize := fs.Int("page-size", 1000, "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *pageSize < 1 || *pageSize > 1000 {
		return intIn("page-size", *pageSize, 1, 1000)
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	req := &v1.ListPoliciesRequest{Subject: *subject, Route: *route, Region: *region, PageSize: int32(*pageSize)}
	list := newPolicyListWriter(e.stdout)
	for {
		msg, err := unary(ctx, cf.timeout, client.ListPolicies, req)
		if err != nil {
			return list.abort(err)
		}
		if err := list.page(msg.GetPolicies()); err != nil {
			return err
		}
		if req.PageToken = msg.GetNextPageToken(); req.PageToken == "" {
			return list.end()
		}
	}
}

// policyListWriter prints the pages of ListPolicies as one answer, as
// printJSONList prints an unpaged one ({"policies": [...]}, [] when
// empty), each page written as it arrives: the list of every policy is
// never held whole, and a page's --timeout is its own.
type policyListWriter struct {
	w       *bufio.Writer
	printed int
}

func newPolicyListWriter(w io.Writer) *policyListWriter {
	return &policyListWriter{w: bufio.NewWriterSize(w, 64<<10)}
}

// page prints a page's policies and flushes them.
func (l *policyListWriter) page(policies []*v1.Policy) error {
	if l.printed == 0 && len(policies) > 0 {
		l.w.WriteString("{\n  \"policies\": [")
	}
	var compact, out bytes.Buffer
	for _, p := range policies {
		raw, err := protojson.Marshal(p)
		if err != nil {
			return err
		}
		compact.Reset()
		out.Reset()
		if err := json.Compact(&compact, raw); err != nil {
			return err
		}
		if err := json.Indent(&out, compact.Bytes(), "    ", "  "); err != nil {
			return err
		}
		if l.printed > 0 {
			l.w.WriteByte(',')
		}
		l.w.WriteString("\n    ")
		l.w.Write(out.Bytes())
		l.printed++
	}
	return l.w.Flush()
}

// end closes the list after its last page.
func (l *policyListWriter) end() error {
	if l.printed == 0 {
		l.w.WriteString("{\n  \"policies\": []\n}\n")
	} else {
		l.w.WriteString("\n  ]\n}\n")
	}
	return l.w.Flush()
}

// abort returns err, a page's failure, after the pages printed before it:
// the output stops there, not valid JSON, and the exit code is err's.
func (l *policyListWriter) abort(err error) error {
	if l.printed > 0 {
		l.w.WriteString("\n")
		l.w.Flush()
	}
	return err
}

func runPolicyRollback(ctx context.Context, e *env, args []string) error {
	fs := newFlags("policy rollback")
	var cf clientFlags
	cf.register(fs, e)
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	generation, err := parseGeneration(positional)
	if err != nil {
		return err
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.RollbackPolicy, &v1.RollbackPolicyRequest{Generation: generation})
	if err != nil {
		return err
	}
	return printJSONAll(e.stdout, msg)
}

// policyFile is the human form of a policy (see policyHelp). Its keys are
// the API's JSON names of the same fields, and its values take the API's
// JSON spellings too (int64s as quoted strings, ROLLOUT_MODE_SHADOW), so
// that a policy the API printed (policy get) reads as a file.
type policyFile struct {
	Schema          string           `json:"schema,omitempty"`
	Generation      yamlfile.Uint64  `json:"generation,omitempty"` // the generation the file was edited from: publish sends it as editedFrom
	Subject         string           `json:"subject"`
	Route           string           `json:"route"`
	Region          string           `json:"region,omitempty"`
	Rollout         fileRollout      `json:"rollout,omitempty"`
	HoldTTL         fileDuration     `json:"holdTtl,omitempty" formerly:"holdTTL"` // the API's spelling; files for older binaries spell it holdTTL
	ExecutionLimit  fileDuration     `json:"executionLimit,omitempty"`
	EpochLength     fileDuration     `json:"epochLength,omitempty"`
	EstimatorDigest string           `json:"estimatorDigest,omitempty"`
	Priority        int32            `json:"priority,omitempty"`
	FairnessWeight  yamlfile.Int64   `json:"fairnessWeight,omitempty"`
	FairnessBudget  float64          `json:"fairnessBudget,omitempty"`
	EmergencyMode   bool             `json:"emergencyMode,omitempty"`
	Dimensions      []dimensionFile  `json:"dimensions"`
	PublishedAt     serverSetIgnored `json:"publishedAt,omitempty"`
	RolledBack      serverSetIgnored `json:"rolledBack,omitempty"`
	Active          serverSetIgnored `json:"active,omitempty"`
	RolloutNow      serverSetIgnored `json:"rolloutNow,omitempty"`
}

type dimensionFile struct {
	Unit           string         `json:"unit"`
	Burst          yamlfile.Int64 `json:"burst"`
	RefillUnits    yamlfile.Int64 `json:"refillUnits,omitempty"`
	RefillInterval fileDuration   `json:"refillInterval,omitempty"`
	MaxReservation yamlfile.Int64 `json:"maxReservation,omitempty"`
	MaxOverdraft   yamlfile.Int64 `json:"maxOverdraft,omitempty"`
}

// serverSetIgnored is a field of a published policy that the server sets
// and a publish ignores (publishedAt, rolledBack, active, rolloutNow): a
// file read from the API's JSON may carry it, and it means nothing there.
type serverSetIgnored = json.RawMessage

// fileRollout is a policy file's rollout mode: its short name (enforce,
// shadow) or the API's name of it (ROLLOUT_MODE_SHADOW), the one rule for
// both spellings; empty is enforce, as the API takes an unset mode.
type fileRollout string

// rolloutModes maps every spelling a file may give to its mode.
var rolloutModes = func() map[string]v1.RolloutMode {
	modes := map[string]v1.RolloutMode{}
	for _, mode := range []v1.RolloutMode{v1.RolloutMode_ROLLOUT_MODE_ENFORCE, v1.RolloutMode_ROLLOUT_MODE_SHADOW} {
		modes[mode.String()] = mode
		modes[rolloutShortName(mode)] = mode
	}
	return modes
}()

// rolloutShortName is the file's name of mode: "shadow" for
// ROLLOUT_MODE_SHADOW.
func rolloutShortName(mode v1.RolloutMode) string {
	return strings.ToLower(strings.TrimPrefix(mode.String(), "ROLLOUT_MODE_"))
}

func (r *fileRollout) UnmarshalJSON(raw []byte) error {
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return fmt.Errorf("%s is no rollout mode: want enforce or shadow", raw)
	}
	if _, ok := rolloutModes[name]; !ok {
		return fmt.Errorf("%q is no rollout mode: want enforce or shadow (or %s, %s)", name,
			v1.RolloutMode_ROLLOUT_MODE_ENFORCE, v1.RolloutMode_ROLLOUT_MODE_SHADOW)
	}
	*r = fileRollout(name)
	return nil
}

// mode returns the mode r names (enforce when empty).
func (r fileRollout) mode() v1.RolloutMode {
	if mode, ok := rolloutModes[string(r)]; ok {
		return mode
	}
	return v1.RolloutMode_ROLLOUT_MODE_ENFORCE
}

// fileDuration is a duration as a file writes it ("30s", "5m", "1h", or
// the API's "3600s"); empty when the file leaves it out.
type fileDuration string

func (d *fileDuration) UnmarshalJSON(raw []byte) error {
	var text string
	if string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, &text); err != nil {
		return fmt.Errorf("%s is not a duration: write durations like 30s, 5m, 1h", raw)
	}
	value, err := time.ParseDuration(text)
	if err != nil {
		return fmt.Errorf("%q is not a duration: write durations like 30s, 5m, 1h", text)
	}
	if value < 0 {
		return fmt.Errorf("%q is negative", text)
	}
	*d = fileDuration(text)
	return nil
}

// proto returns d as the API's Duration, nil when d is empty (the
// server's default applies).
func (d fileDuration) proto() *durationpb.Duration {
	if d == "" {
		return nil
	}
	value, err := time.ParseDuration(string(d))
	if err != nil {
		panic(fmt.Sprintf("policy file: duration %q read without its check", string(d)))
	}
	return durationpb.New(value)
}

// fileDurationOf is the file's spelling of an API Duration ("" for none).
func fileDurationOf(d *durationpb.Duration) fileDuration {
	if d == nil {
		return ""
	}
	return fileDuration(d.AsDuration().String())
}

// parsePolicyFile reads the human policy form, the file named name ("-"
// for standard input): strict JSON when it is JSON (a .json name, or "{"
// first), else YAML (yamlfile.UnmarshalFile). It returns the policy and
// the generation the file was edited from (0: none given).
// Unknown fields are errors (a misspelt "holdTime" must not silently
// become the default), as are malformed values, each naming its line and
// field, and JSON's syntax errors their line and column; the server
// validates the rest.
func parsePolicyFile(name string, data []byte) (*v1.Policy, uint64, error) {
	var f policyFile
	if err := yamlfile.UnmarshalFile(name, data, &f); err != nil {
		return nil, 0, err
	}
	if f.Schema != "" && f.Schema != "admissionBudget.v1" {
		return nil, 0, fmt.Errorf("schema %q: want admissionBudget.v1", f.Schema)
	}
	p := &v1.Policy{
		Subject:         f.Subject,
		Route:           f.Route,
		Region:          f.Region,
		Rollout:         f.Rollout.mode(),
		HoldTtl:         f.HoldTTL.proto(),
		ExecutionLimit:  f.ExecutionLimit.proto(),
		EpochLength:     f.EpochLength.proto(),
		EstimatorDigest: f.EstimatorDigest,
		Priority:        f.Priority,
		FairnessWeight:  int64(f.FairnessWeight),
		FairnessBudget:  f.FairnessBudget,
		EmergencyMode:   f.EmergencyMode,
	}
	for _, d := range f.Dimensions {
		p.Dimensions = append(p.Dimensions, &v1.Dimension{
			Unit: d.Unit, Burst: int64(d.Burst), RefillUnits: int64(d.RefillUnits), RefillInterval: d.RefillInterval.proto(),
			MaxReservation: int64(d.MaxReservation), MaxOverdraft: int64(d.MaxOverdraft),
		})
	}
	return p, uint64(f.Generation), nil
}

// policyFileOf renders a published policy in the file form, so that it can
// be edited and published again: with its generation, which publish then
// sends as the generation the file was edited from. A dimension's
// maxReservation equal to its burst is left out (writtenMaxReservation).
func policyFileOf(p *v1.Policy) policyFile {
	f := policyFile{
		Schema:          p.GetSchema(),
		Generation:      yamlfile.Uint64(p.GetGeneration()),
		Subject:         p.GetSubject(),
		Route:           p.GetRoute(),
		Region:          p.GetRegion(),
		Rollout:         fileRollout(rolloutShortName(v1.RolloutMode_ROLLOUT_MODE_ENFORCE)),
		HoldTTL:         fileDurationOf(p.GetHoldTtl()),
		ExecutionLimit:  fileDurationOf(p.GetExecutionLimit()),
		EpochLength:     fileDurationOf(p.GetEpochLength()),
		EstimatorDigest: p.GetEstimatorDigest(),
		Priority:        p.GetPriority(),
		FairnessWeight:  yamlfile.Int64(p.GetFairnessWeight()),
		FairnessBudget:  p.GetFairnessBudget(),
		EmergencyMode:   p.GetEmergencyMode(),
	}
	if p.GetRollout() == v1.RolloutMode_ROLLOUT_MODE_SHADOW {
		f.Rollout = fileRollout(rolloutShortName(v1.RolloutMode_ROLLOUT_MODE_SHADOW))
	}
	for _, d := range p.GetDimensions() {
		f.Dimensions = append(f.Dimensions, dimensionFile{
			Unit: d.GetUnit(), Burst: yamlfile.Int64(d.GetBurst()), RefillUnits: yamlfile.Int64(d.GetRefillUnits()),
			RefillInterval: fileDurationOf(d.GetRefillInterval()),
			MaxReservation: yamlfile.Int64(writtenMaxReservation(d)),
			MaxOverdraft:   yamlfile.Int64(d.GetMaxOverdraft()),
		})
	}
	return f
}
