package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
)

func init() {
	register(&command{name: "shard", summary: "emergency shards: issue, list, inspect, receipts, reconcile, keys, keygen", help: shardHelp, subs: []subcommand{
		{"issue", runShardIssue}, {"list", runShardList}, {"inspect", runShardInspect},
		{"receipts", func(_ context.Context, e *env, args []string) error { return runShardReceipts(e, args) }},
		{"reconcile", runShardReconcile}, {"keys", runShardKeys},
		{"keygen", func(_ context.Context, e *env, args []string) error { return runShardKeygen(e, args) }}}})
}

const shardHelp = `Usage: capledger shard <issue|list|inspect|receipts|reconcile|keys|keygen> [flags]

An emergency shard (emergencyShard.v1) is capacity carved out of a
subject's account while the ledger is healthy (available moves to
retiredForEmergency) and handed, signed with Ed25519, to ONE gateway process
(gateway id + boot epoch) so it can keep admitting within that bound while
it cannot reach the ledger. After it reconnects it reports its receipts
once; the ledger remints the unused units into the active generation and
keeps used and unknown units retired. Only policies with emergency_mode on
allow issuance. Gateways normally do all this through the Go SDK
(client.Emergency); these commands are for operators.

  shard issue --subject S --route R --units tokens=N --gateway GW --boot N
              [--region R] [--ttl 10m] [--id ID]
      carve a shard and print it, with its token (base64).
  shard list [--subject S] [--route R] [--region R] [--gateway GW] [--unreconciled]
      one line per shard: id, subject, gateway, boot, fence, expiry, state.
  shard inspect ID
      print one shard as the ledger records it (allocation, spent, unknown,
      reminted, refused submissions, whether its signature verifies).
  shard inspect --token-file FILE|- [--keys FILE]
      decode a token offline; with --keys, verify its signature.
  shard receipts ID --dir DIR --gateway GW
      print, from a stopped gateway's shard store directory, the receipts
      of shard ID its next reconciliation would send, in the --receipts
      format below ([] when it has nothing to report). Opening the
      directory is a restart of the gateway: its shards stop admitting.
  shard reconcile ID --gateway GW [--receipts FILE|-]
      report a gateway's receipts for the shard: a JSON array of
      {"reservation_id", "state", "reserved_units", "actual_units"} (or the
      API's lowerCamelCase names: reservationId, reservedUnits, actualUnits),
      states SETTLED, SETTLED_WITH_DEBT, RELEASED, EXPIRED, STARTED,
      USAGE_UNKNOWN (or RESERVATION_STATE_SETTLED and so on).
      Without --receipts: no receipts, i.e. the gateway used nothing (for a
      shard that never reached its gateway). Accepted once per shard;
      later, only receipts resolving work left unknown.
  shard reconcile --dir DIR --gateway GW   (not with --receipts)
      reconcile every shard of a gateway's shard store directory (a stopped
      gateway's disk): the receipts it logged are sent, once.
  shard keys
      list the server's shard verification keys (the signing one marked).
  shard keygen [--id KEYID]
      print a new private key line for a keys file (rotation: append it to
      the file given to "serve --shard-keys"; the last private key signs,
      every listed key verifies, a removed key no longer verifies).

Flags of issue:
  --subject S, --route R, --region R   the capacity (region default global)
  --units SPEC      units to carve out, e.g. tokens=5000,requests=50
  --gateway GW      gateway identity the shard is bound to
  --boot N          the gateway process's boot epoch
  --ttl DUR         how long it may be spent (default 10m; at least 1s, at
                    most serve --shard-max-ttl)
  --id ID           shard id (default: a new "sh-" ULID); retry with the same
                    id after a lost answer

Example:
  capledger shard issue --subject tenant-7 --route chat.generate \
      --units tokens=5000 --gateway gw-eu-1 --boot 3 --ttl 15m
  capledger shard list --unreconciled
  capledger shard reconcile sh-01J... --gateway gw-eu-1 --receipts receipts.json

` + clientFlagsHelp + "\n" + exitCodesHelp

func runShardIssue(ctx context.Context, e *env, args []string) error {
	fs := newFlags("shard issue")
	var cf clientFlags
	cf.register(fs, e)
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	unitsSpec := fs.String("units", "", "")
	gateway := fs.String("gateway", "", "")
	boot := fs.Uint64("boot", 0, "")
	ttl := fs.Duration("ttl", 10*time.Minute, "")
	id := fs.String("id", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *subject == "" || *route == "" || *gateway == "" || *boot == 0 || *unitsSpec == "" {
		return usagef("--subject, --route, --units, --gateway and --boot are required")
	}
	// The server refuses what is above its --shard-max-ttl too.
	if err := durationIn("ttl", *ttl, time.Second, maxAPIDuration); err != nil {
		return err
	}
	units, err := parseUnits("units", *unitsSpec)
	if err != nil {
		return err
	}
	if *id == "" {
		*id = "sh-" + ulid.MustNew(ulid.Now(), rand.Reader).String()
	}
	sc, err := cf.shardClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, sc.IssueShard, &v1.IssueShardRequest{
		ShardId: *id, Subject: *subject, Route: *route, Region: *region, Units: units,
		GatewayId: *gateway, BootEpoch: *boot, Ttl: durationpb.New(*ttl),
	})
	if err != nil {
		return err
	}
	return printJSON(e.stdout, msg)
}

func runShardList(ctx context.Context, e *env, args []string) error {
	fs := newFlags("shard list")
	var cf clientFlags
	cf.register(fs, e)
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	gateway := fs.String("gateway", "", "")
	unreconciled := fs.Bool("unreconciled", false, "")
	asJSON := fs.Bool("json", false, "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	sc, err := cf.shardClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, sc.ListShards, &v1.ListShardsRequest{
		Subject: *subject, Route: *route, Region: *region, GatewayId: *gateway, UnreconciledOnly: *unreconciled,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSONList(e.stdout, msg)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tSUBJECT\tGATEWAY\tBOOT\tFENCE\tALLOCATED\tEXPIRES\tSTATE")
	now := time.Now()
	for _, s := range msg.GetShards() {
		state := "live"
		switch {
		case s.GetReconciled() && len(nonZero(s.GetUnknownUnits())) > 0:
			state = "reconciled, unknown " + formatUnits(s.GetUnits(), s.GetUnknownUnits())
		case s.GetReconciled():
			state = "reconciled"
		case !now.Before(s.GetExpiresAt().AsTime()):
			state = "expired, not reconciled"
		}
		fmt.Fprintf(tw, "%s\t%s#%d\t%s\t%d\t%d\t%s\t%s\t%s\n", cell(s.GetShardId()), keyCell(s.GetSubject(), s.GetRoute(), s.GetRegion()),
			s.GetPolicyGeneration(), cell(s.GetGatewayId()), s.GetBootEpoch(), s.GetFence(),
			formatUnits(s.GetUnits(), s.GetAllocatedUnits()), s.GetExpiresAt().AsTime().Format(time.RFC3339), state)
	}
	return tw.Flush()
}

func nonZero(units map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range units {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// formatUnits prints units in the shard's dimension order: "tokens=5,requests=1".
func formatUnits(order []string, units map[string]int64) string {
	parts := make([]string, 0, len(order))
	for _, name := range order {
		parts = append(parts, fmt.Sprintf("%s=%d", cell(name), units[name]))
	}
	return strings.Join(parts, ",")
}

func runShardInspect(ctx context.Context, e *env, args []string) error {
	fs := newFlags("shard inspect")
	var cf clientFlags
	cf.register(fs, e)
	tokenPath := fs.String("token-file", "", "")
	keysPath := fs.String("keys", "", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *tokenPath != "" {
		if err := wantArgs(positional, 0, ""); err != nil {
			return err
		}
		return inspectToken(e, *tokenPath, *keysPath)
	}
	if *keysPath != "" {
		return usagef("--keys verifies a --token-file offline; give --token-file FILE, or leave out --keys to ask the server")
	}
	if err := wantArgs(positional, 1, "a shard id (or --token-file FILE)"); err != nil {
		return err
	}
	sc, err := cf.shardClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, sc.GetShard, &v1.GetShardRequest{ShardId: positional[0]})
	if err != nil {
		return err
	}
	return printJSON(e.stdout, msg)
}

// inspectToken decodes a token (base64 or raw bytes) offline and, with a
// keys file, verifies its signature.
func inspectToken(e *env, path, keysPath string) error {
	raw, err := readInput(path)
	if err != nil {
		return usagef("--token-file: %v", err)
	}
	token := raw
	if decoded, derr := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw))); derr == nil {
		token = decoded
	}
	sh, err := ledger.DecodeShardToken(token)
	if err != nil {
		return exitError{code: exitUsage, err: err}
	}
	out := map[string]any{
		"schema": ledger.SchemaShard, "shardId": sh.ID, "subject": sh.Account.Subject, "route": sh.Account.Route,
		"region": sh.Account.Region, "policyGeneration": sh.Account.Generation, "gatewayId": sh.GatewayID,
		"bootEpoch": sh.BootEpoch, "fence": sh.Fence, "allocated": sh.Allocated, "issuedAt": sh.IssuedAt,
		"expiresAt": sh.ExpiresAt, "keyId": sh.KeyID, "signature": base64.StdEncoding.EncodeToString(sh.Signature),
	}
	var verifyErr error
	if keysPath != "" {
		keys, err := server.LoadShardKeys(keysPath)
		if err != nil {
			return usagef("--keys: %v", err)
		}
		verifyErr = ledger.VerifyShardSignature(sh, keys)
		out["signatureValid"] = verifyErr == nil
	}
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	if verifyErr != nil {
		return exitError{code: exitConflict, err: verifyErr}
	}
	return nil
}

// parseReceipts reads a --receipts file: a JSON array of receipts in the
// API's JSON form (ShardReceipt, read by protojson: snake_case or
// lowerCamelCase names, int64s as numbers or strings, unknown fields
// refused), whose state may also be written short and in any case
// ("SETTLED", "usage_unknown"), as this command always took it.
func parseReceipts(raw []byte) ([]*v1.ShardReceipt, error) {
	var items []json.RawMessage
	if err := decodeStrictJSON(raw, &items); err != nil {
		return nil, err
	}
	receipts := make([]*v1.ShardReceipt, 0, len(items))
	for i, item := range items {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(item, &fields); err != nil || fields == nil {
			return nil, fmt.Errorf("receipt %d: not a JSON object", i)
		}
		var state string
		if err := json.Unmarshal(fields["state"], &state); err != nil || state == "" {
			return nil, fmt.Errorf("receipt %d: want a state (SETTLED, SETTLED_WITH_DEBT, RELEASED, EXPIRED, STARTED or USAGE_UNKNOWN)", i)
		}
		full := "RESERVATION_STATE_" + strings.TrimPrefix(strings.ToUpper(state), "RESERVATION_STATE_")
		if _, ok := v1.ReservationState_value[full]; !ok {
			return nil, fmt.Errorf("receipt %d has state %q", i, state)
		}
		fields["state"], _ = json.Marshal(full)
		normalized, err := json.Marshal(fields)
		if err != nil {
			return nil, fmt.Errorf("receipt %d: %v", i, err)
		}
		var r v1.ShardReceipt
		if err := protojson.Unmarshal(normalized, &r); err != nil {
			return nil, fmt.Errorf("receipt %d: %v", i, err)
		}
		receipts = append(receipts, &r)
	}
	return receipts, nil
}

func runShardReconcile(ctx context.Context, e *env, args []string) error {
	fs := newFlags("shard reconcile")
	var cf clientFlags
	cf.register(fs, e)
	gateway := fs.String("gateway", "", "")
	receiptsPath := fs.String("receipts", "", "")
	dir := fs.String("dir", "", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *gateway == "" {
		return usagef("--gateway is required")
	}
	if *dir != "" {
		if *receiptsPath != "" {
			return usagef("--dir reports the receipts the store in DIR keeps, --receipts those of a file: give one or the other")
		}
		if err := wantArgs(positional, 0, ""); err != nil {
			return err
		}
		return reconcileDir(ctx, e, &cf, *dir, *gateway)
	}
	if err := wantArgs(positional, 1, "a shard id (or --dir DIR)"); err != nil {
		return err
	}
	var receipts []*v1.ShardReceipt
	if *receiptsPath != "" {
		raw, err := readInput(*receiptsPath)
		if err != nil {
			return usagef("--receipts: %v", err)
		}
		if receipts, err = parseReceipts(raw); err != nil {
			return usagef("--receipts %s: %v", *receiptsPath, err)
		}
	}
	sc, err := cf.shardClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, sc.ReconcileShard, &v1.ReconcileShardRequest{ShardId: positional[0], GatewayId: *gateway, Receipts: receipts})
	if err != nil {
		return err
	}
	return printJSON(e.stdout, msg)
}

// runShardReceipts prints a shard's due receipts from a shard store
// directory as a --receipts file, for a reconciliation by hand.
func runShardReceipts(e *env, args []string) error {
	fs := newFlags("shard receipts")
	gateway := fs.String("gateway", "", "")
	dir := fs.String("dir", "", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *gateway == "" || *dir == "" {
		return usagef("--dir and --gateway are required")
	}
	if err := wantArgs(positional, 1, "a shard id"); err != nil {
		return err
	}
	st, err := openShardDir(*dir, *gateway)
	if err != nil {
		return err
	}
	defer st.Close()
	due, isDue, err := st.DueSubmission(positional[0])
	if err != nil {
		return exitError{code: exitNotFound, err: err}
	}
	// Both print []: stderr says which, stdout stays a --receipts file.
	switch {
	case !isDue:
		fmt.Fprintf(e.stderr, "shard %s: nothing to report (its first report was accepted and no receipt was resolved since)\n", positional[0])
	case len(due) == 0:
		fmt.Fprintf(e.stderr, "shard %s: first report, no receipts: nothing was admitted from it; reconciled with this empty list, all of it is reminted\n", positional[0])
	}
	out := make([]printedReceipt, 0, len(due))
	for _, r := range due {
		out = append(out, printedReceipt{ReservationID: r.GetReservationId(),
			State:         strings.TrimPrefix(r.GetState().String(), "RESERVATION_STATE_"),
			ReservedUnits: r.GetReservedUnits(), ActualUnits: r.GetActualUnits()})
	}
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// printedReceipt is one receipt as shard receipts prints it: the
// snake_case names and short states a --receipts file has always had
// (parseReceipts reads them).
type printedReceipt struct {
	ReservationID string           `json:"reservation_id"`
	State         string           `json:"state"`
	ReservedUnits map[string]int64 `json:"reserved_units"`
	ActualUnits   map[string]int64 `json:"actual_units"`
}

// openShardDir opens an existing shard store directory (not creating one
// for a mistyped path).
func openShardDir(dir, gateway string) (*client.ShardStore, error) {
	if _, err := os.Stat(filepath.Join(dir, "shards.log")); err != nil {
		return nil, usagef("--dir %s: not a shard store (%v)", dir, err)
	}
	st, err := client.OpenShardStore(dir, client.ShardStoreOptions{GatewayID: gateway})
	if err != nil {
		return nil, exitError{code: exitConflict, err: err}
	}
	return st, nil
}

// reconcileDir reports every shard of a stopped gateway's shard store
// through the SDK, which sends exactly the receipts the store logged.
func reconcileDir(ctx context.Context, e *env, cf *clientFlags, dir, gateway string) error {
	st, err := openShardDir(dir, gateway)
	if err != nil {
		return err
	}
	defer st.Close()
	c, err := cf.sdk()
	if err != nil {
		return err
	}
	defer c.Close()
	em := client.NewEmergency(c, st, client.EmergencyOptions{Token: cf.token})
	ctx, cancel := cf.context(ctx)
	defer cancel()
	results, err := em.Reconcile(ctx)
	for _, r := range results {
		fmt.Fprintf(e.stdout, "%s: %d receipts, reminted %v, debt %v, already reconciled %v\n",
			r.ShardID, r.Receipts, r.Reminted, r.Debt, r.AlreadyReconciled)
	}
	if err != nil {
		return describe(err)
	}
	if len(results) == 0 {
		fmt.Fprintln(e.stdout, "nothing to report")
	}
	return nil
}

func runShardKeys(ctx context.Context, e *env, args []string) error {
	fs := newFlags("shard keys")
	var cf clientFlags
	cf.register(fs, e)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	sc, err := cf.shardClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, sc.ListShardKeys, &v1.ListShardKeysRequest{})
	if err != nil {
		return err
	}
	for _, k := range msg.GetKeys() {
		mark := ""
		if k.GetSigning() {
			mark = "  (signing)"
		}
		fmt.Fprintf(e.stdout, "%s public %s%s\n", k.GetKeyId(), base64.StdEncoding.EncodeToString(k.GetPublicKey()), mark)
	}
	return nil
}

func runShardKeygen(e *env, args []string) error {
	fs := newFlags("shard keygen")
	id := fs.String("id", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	line, err := server.NewShardKeyLine(*id, rand.Reader, time.Now())
	if err != nil {
		return usagef("%v", err)
	}
	_, err = io.WriteString(e.stdout, line)
	return err
}

// shardConfig is the ShardService configuration of serve: the keys at
// keysPath, or (when empty) a keys file in the data directory, created with
// a fresh key on first start (an ephemeral key for a memory store).
func shardConfig(keysPath, dataDir, storeSpec string, maxTTL time.Duration, log *slog.Logger) (*server.ShardConfig, error) {
	var keys *server.ShardKeys
	var err error
	switch {
	case keysPath != "":
		keys, err = server.LoadShardKeys(keysPath)
	case storeSpec == "memory":
		// Nothing of a memory store outlives the process, its shards
		// included: an ephemeral key writes nothing to disk either.
		var line string
		if line, err = server.NewShardKeyLine("", rand.Reader, time.Now()); err == nil {
			keys, err = server.ParseShardKeys(strings.NewReader(line), "ephemeral key")
		}
	default:
		path := filepath.Join(dataDir, "shard-keys")
		var created bool
		keys, created, err = server.EnsureShardKeys(path)
		if created {
			log.Info("generated a shard signing key", "path", path)
		}
		if strings.HasPrefix(storeSpec, "postgres") {
			log.Warn("several replicas need the same shard keys: pass --shard-keys with one shared keys file", "path", path)
		}
	}
	if err != nil {
		return nil, err
	}
	for _, k := range keys.Keys() {
		log.Info("shard key", "id", k.KeyID, "public", base64.StdEncoding.EncodeToString(k.PublicKey), "signing", k.Signing)
	}
	keys.LogReloads(log)
	return &server.ShardConfig{Keys: keys, MaxTTL: maxTTL}, nil
}

var _ ledger.ShardKeys = (*server.ShardKeys)(nil)
