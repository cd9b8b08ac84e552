package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"

	"github.com/capledger/capledger/internal/yamlfile"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

func init() {
	register(&command{name: "policy", summary: "publish, get, list and roll back policies (admissionBudget.v1)", help: policyHelp, run: runPolicy})
}

const policyHelp = `Usage:
  capledger policy publish FILE     publish a policy file (YAML or JSON; - for stdin)
  capledger policy get GEN [--format json|yaml]   json (default): the API's record;
                                    yaml: the policy file form, to edit and publish
  capledger policy list [--subject S] [--route R] [--region REGION]
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
Field names are those of the API's Policy (docs/API.md, PublishPolicy);
"holdTTL", the spelling of older files, is still read as holdTtl, and a file
giving both is refused. An unknown field, or a key spelt in another case
than its field ("Burst" for "burst", "HoldTtl" for "holdTtl"), is an error
naming both:

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
  capledger policy get 3 --format yaml > tenant-7.yaml   # edit, publish again
  (the JSON "get" prints is the API's Policy message, with generation,
  publishedAt and int64s as strings: publish reads the file form only)
  capledger policy rollback 3

` + clientFlagsHelp + "\n" + exitCodesHelp

func runPolicy(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("want a subcommand: publish, get, list or rollback")
	}
	switch args[0] {
	case "publish":
		return runPolicyPublish(ctx, e, args[1:])
	case "get":
		return runPolicyGet(ctx, e, args[1:])
	case "list":
		return runPolicyList(ctx, e, args[1:])
	case "rollback":
		return runPolicyRollback(ctx, e, args[1:])
	case "-h", "--help", "help":
		return flag.ErrHelp
	}
	return usagef("unknown policy subcommand %q: want publish, get, list or rollback", args[0])
}

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
	policy, err := parsePolicyFile(data)
	if err != nil {
		return usagef("policy %s: %v", positional[0], err)
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.PublishPolicy, &v1.PublishPolicyRequest{Policy: policy})
	if err != nil {
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
	return printJSON(e.stdout, msg.GetPolicy())
}

func runPolicyList(ctx context.Context, e *env, args []string) error {
	fs := newFlags("policy list")
	var cf clientFlags
	cf.register(fs, e)
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.ListPolicies, &v1.ListPoliciesRequest{Subject: *subject, Route: *route, Region: *region})
	if err != nil {
		return err
	}
	return printJSON(e.stdout, msg)
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
// the API's JSON names of the same fields, so that a policy copied from an
// API example reads as a file.
type policyFile struct {
	Schema          string          `json:"schema,omitempty"`
	Subject         string          `json:"subject"`
	Route           string          `json:"route"`
	Region          string          `json:"region,omitempty"`
	Rollout         string          `json:"rollout,omitempty"`
	HoldTTL         string          `json:"holdTtl,omitempty" formerly:"holdTTL"` // the API's spelling; files for older binaries spell it holdTTL
	ExecutionLimit  string          `json:"executionLimit,omitempty"`
	EpochLength     string          `json:"epochLength,omitempty"`
	EstimatorDigest string          `json:"estimatorDigest,omitempty"`
	Priority        int32           `json:"priority,omitempty"`
	FairnessWeight  int64           `json:"fairnessWeight,omitempty"`
	FairnessBudget  float64         `json:"fairnessBudget,omitempty"`
	EmergencyMode   bool            `json:"emergencyMode,omitempty"`
	Dimensions      []dimensionFile `json:"dimensions"`
}

type dimensionFile struct {
	Unit           string `json:"unit"`
	Burst          int64  `json:"burst"`
	RefillUnits    int64  `json:"refillUnits,omitempty"`
	RefillInterval string `json:"refillInterval,omitempty"`
	MaxReservation int64  `json:"maxReservation,omitempty"`
	MaxOverdraft   int64  `json:"maxOverdraft,omitempty"`
}

// parsePolicyFile reads the human policy form (YAML or JSON). Unknown
// fields are errors (a misspelt "holdTime" must not silently become the
// default), as are malformed durations and unknown rollout modes; the
// server validates the rest.
func parsePolicyFile(data []byte) (*v1.Policy, error) {
	var f policyFile
	if err := yamlfile.UnmarshalStrict(data, &f); err != nil {
		return nil, err
	}
	if f.Schema != "" && f.Schema != "admissionBudget.v1" {
		return nil, fmt.Errorf("schema %q: want admissionBudget.v1", f.Schema)
	}
	p := &v1.Policy{
		Subject:         f.Subject,
		Route:           f.Route,
		Region:          f.Region,
		EstimatorDigest: f.EstimatorDigest,
		Priority:        f.Priority,
		FairnessWeight:  f.FairnessWeight,
		FairnessBudget:  f.FairnessBudget,
		EmergencyMode:   f.EmergencyMode,
	}
	switch f.Rollout {
	case "", "enforce":
		p.Rollout = v1.RolloutMode_ROLLOUT_MODE_ENFORCE
	case "shadow":
		p.Rollout = v1.RolloutMode_ROLLOUT_MODE_SHADOW
	default:
		return nil, fmt.Errorf("rollout %q: want enforce or shadow", f.Rollout)
	}
	var err error
	if p.HoldTtl, err = fileDuration("holdTtl", f.HoldTTL); err != nil {
		return nil, err
	}
	if p.ExecutionLimit, err = fileDuration("executionLimit", f.ExecutionLimit); err != nil {
		return nil, err
	}
	if p.EpochLength, err = fileDuration("epochLength", f.EpochLength); err != nil {
		return nil, err
	}
	for i, d := range f.Dimensions {
		interval, err := fileDuration(fmt.Sprintf("dimensions[%d].refillInterval", i), d.RefillInterval)
		if err != nil {
			return nil, err
		}
		p.Dimensions = append(p.Dimensions, &v1.Dimension{
			Unit: d.Unit, Burst: d.Burst, RefillUnits: d.RefillUnits, RefillInterval: interval,
			MaxReservation: d.MaxReservation, MaxOverdraft: d.MaxOverdraft,
		})
	}
	return p, nil
}

func fileDuration(field, value string) (*durationpb.Duration, error) {
	if value == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		return nil, fmt.Errorf("%s: %v (write durations like 30s, 5m, 1h)", field, err)
	}
	if d < 0 {
		return nil, fmt.Errorf("%s: %s is negative", field, value)
	}
	return durationpb.New(d), nil
}

// policyFileOf renders a published policy in the file form, so that it can
// be edited and published again.
func policyFileOf(p *v1.Policy) policyFile {
	f := policyFile{
		Schema:          p.GetSchema(),
		Subject:         p.GetSubject(),
		Route:           p.GetRoute(),
		Region:          p.GetRegion(),
		Rollout:         "enforce",
		EstimatorDigest: p.GetEstimatorDigest(),
		Priority:        p.GetPriority(),
		FairnessWeight:  p.GetFairnessWeight(),
		FairnessBudget:  p.GetFairnessBudget(),
		EmergencyMode:   p.GetEmergencyMode(),
	}
	if p.GetRollout() == v1.RolloutMode_ROLLOUT_MODE_SHADOW {
		f.Rollout = "shadow"
	}
	text := func(d *durationpb.Duration) string {
		if d == nil {
			return ""
		}
		return d.AsDuration().String()
	}
	f.HoldTTL, f.ExecutionLimit, f.EpochLength = text(p.GetHoldTtl()), text(p.GetExecutionLimit()), text(p.GetEpochLength())
	for _, d := range p.GetDimensions() {
		f.Dimensions = append(f.Dimensions, dimensionFile{
			Unit: d.GetUnit(), Burst: d.GetBurst(), RefillUnits: d.GetRefillUnits(), RefillInterval: text(d.GetRefillInterval()),
			MaxReservation: d.GetMaxReservation(), MaxOverdraft: d.GetMaxOverdraft(),
		})
	}
	return f
}
