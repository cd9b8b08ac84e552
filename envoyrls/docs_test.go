package envoyrls_test

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/capledger/capledger/envoyrls"
)

// yamlBlocks returns the ```yaml blocks of a Markdown file.
func yamlBlocks(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(data), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// TestDocsEnvoyYAML checks docs/ENVOY.md against the code: its mapping
// block is the mapping file the tests serve, and its Envoy bootstrap is a
// valid config.bootstrap.v3.Bootstrap (Envoy's own types and generated
// validation) whose ratelimit filters call the capledger cluster over
// HTTP/2 and whose every rate limit yields a descriptor that the mapping
// maps — the apply_on_stream_done one as the settle of the same id.
func TestDocsEnvoyYAML(t *testing.T) {
	blocks := yamlBlocks(t, "../docs/ENVOY.md")
	var mappingDoc, bootstrapDoc string
	for _, b := range blocks {
		switch {
		case strings.Contains(b, "static_resources:"):
			bootstrapDoc = b
		case strings.Contains(b, "unknown_descriptor:"):
			mappingDoc = b
		}
	}
	if mappingDoc == "" || bootstrapDoc == "" {
		t.Fatalf("docs/ENVOY.md lacks the mapping or the bootstrap block (%d yaml blocks)", len(blocks))
	}
	if want := testMapping(t); strings.TrimSpace(mappingDoc) != strings.TrimSpace(want) {
		t.Fatalf("the mapping in docs/ENVOY.md differs from envoyrls/testdata/mapping.yaml:\n%s\n---\n%s", mappingDoc, want)
	}
	mapping, err := envoyrls.ParseConfig([]byte(mappingDoc))
	if err != nil {
		t.Fatalf("docs mapping: %v", err)
	}

	jsonDoc, err := yaml.YAMLToJSON([]byte(bootstrapDoc))
	if err != nil {
		t.Fatalf("envoy.yaml is not YAML: %v", err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(jsonDoc, &boot); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy v3 bootstrap: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails Envoy's validation: %v", err)
	}

	// The capledger cluster speaks HTTP/2 (gRPC).
	clusters := map[string]bool{}
	for _, c := range boot.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
		if c.GetName() != "capledger" {
			continue
		}
		var opts upstreamhttpv3.HttpProtocolOptions
		anyOpts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if anyOpts == nil || anyOpts.UnmarshalTo(&opts) != nil || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Fatal("cluster capledger does not speak HTTP/2")
		}
		// capledger serves no grpc.health.v1: a gRPC health check would
		// mark every replica unhealthy. The HTTP one must be answered,
		// without a token, by the port that serves ShouldRateLimit.
		if len(c.GetHealthChecks()) == 0 {
			t.Fatal("cluster capledger has no health check")
		}
		for _, hc := range c.GetHealthChecks() {
			path := hc.GetHttpHealthCheck().GetPath()
			if path == "" {
				t.Fatalf("cluster capledger: health check %v is not an HTTP one", hc)
			}
			h := newHarness(t, options{config: testMapping(t), auth: true})
			resp, err := http.Get("http://" + h.addr + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("health check GET %s: %s", path, resp.Status)
			}
		}
	}

	// Filters: stage -> domain, every one calling the capledger cluster.
	domains := map[uint32]string{}
	var routes []*routev3.Route
	for _, l := range boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatalf("filter %s: %v", f.GetName(), err)
				}
				for _, hf := range hcm.GetHttpFilters() {
					var rl ratelimitv3.RateLimit
					if hf.GetTypedConfig().UnmarshalTo(&rl) != nil {
						continue
					}
					if got := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != "capledger" || !clusters[got] {
						t.Fatalf("ratelimit filter of domain %s calls cluster %q", rl.GetDomain(), got)
					}
					md := rl.GetRateLimitService().GetGrpcService().GetInitialMetadata()
					if len(md) != 1 || md[0].GetKey() != "authorization" || !strings.HasPrefix(md[0].GetValue(), "Bearer ") {
						t.Fatalf("domain %s: no bearer token in initial_metadata: %v", rl.GetDomain(), md)
					}
					domains[rl.GetStage()] = rl.GetDomain()
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					routes = append(routes, vh.GetRoutes()...)
				}
			}
		}
	}
	if len(domains) != len(mapping.Domains) {
		t.Fatalf("filters serve domains %v; the mapping has %d", domains, len(mapping.Domains))
	}

	// Every rate limit's descriptor maps; a request id header comes with a
	// phase-marked twin after the stream.
	checks, settles := 0, 0
	for _, r := range routes {
		for _, rl := range r.GetRoute().GetRateLimits() {
			domain, ok := domains[rl.GetStage().GetValue()]
			if !ok {
				t.Fatalf("route %s: rate limit of stage %d, which no filter runs", r.GetMatch().GetPrefix(), rl.GetStage().GetValue())
			}
			var entries []envoyrls.Entry
			for _, a := range rl.GetActions() {
				switch {
				case a.GetRequestHeaders() != nil:
					entries = append(entries, envoyrls.Entry{Key: a.GetRequestHeaders().GetDescriptorKey(), Value: "example"})
				case a.GetGenericKey() != nil:
					key := a.GetGenericKey().GetDescriptorKey()
					if key == "" {
						key = "generic_key"
					}
					entries = append(entries, envoyrls.Entry{Key: key, Value: a.GetGenericKey().GetDescriptorValue()})
				default:
					t.Fatalf("route %s: action %v not covered by this test", r.GetMatch().GetPrefix(), a)
				}
			}
			m, ok := mapping.Map(domain, entries)
			if !ok {
				t.Fatalf("route %s, domain %s: descriptor %v maps to no rule", r.GetMatch().GetPrefix(), domain, entries)
			}
			if m.Settle != rl.GetApplyOnStreamDone() {
				t.Fatalf("route %s: apply_on_stream_done %v but settle %v", r.GetMatch().GetPrefix(), rl.GetApplyOnStreamDone(), m.Settle)
			}
			if m.Settle {
				settles++
				if rl.GetHitsAddend().GetFormat() == "" {
					t.Fatalf("route %s: the settle carries no cost (hits_addend.format)", r.GetMatch().GetPrefix())
				}
			} else {
				checks++
			}
		}
	}
	if checks != 2 || settles != 1 {
		t.Fatalf("%d checks and %d settles in the example; want 2 and 1", checks, settles)
	}
}
