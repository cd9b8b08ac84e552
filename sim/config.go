package sim

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Config sizes every interleaving of a run. Each interleaving draws its own
// shape (how many gateways, executors, tenants, dimensions and requests,
// which fault sites are on and how often they fire) from its seed, within
// these bounds; the same seed and Config always give the same interleaving.
type Config struct {
	// Gateways is the most gateways an interleaving has (at least 2, since
	// two gateways reserving at once is one of the faults).
	Gateways int
	// Executors is the most executors.
	Executors int
	// Tenants is the most tenants (each its own subject and policy).
	Tenants int
	// Requests is the most requests one gateway sends.
	Requests int
	// ArrivalWindow is the simulated time over which requests arrive.
	ArrivalWindow time.Duration
	// HealAt is when faults heal: no site fires after it, partitions end,
	// crashed processes come back.
	HealAt time.Duration
	// Deadline bounds how long after HealAt everything may take to
	// converge (every UNKNOWN resolved, every hold ended, every debt
	// repaid); past it the interleaving fails the liveness gate.
	Deadline time.Duration
	// AuditEvery runs the full ledger.Audit over the store's snapshot after
	// every AuditEvery-th commit, besides the incremental checks after
	// every commit and the audit at the end and after each ledger restart;
	// 0 audits only at those points, 1 after every commit.
	AuditEvery int
	// LastEvents is how many events a violation report shows.
	LastEvents int
	// TwoUnits draws the shapes as before the third unit (1 or 2
	// capacity dimensions, not 1-3): the interleavings of seeds found
	// then, which tests pin, draw exactly what they drew. No flag sets it.
	TwoUnits bool
	// Only, when not empty, enables exactly these sites in every
	// interleaving (each at a rate its seed draws).
	Only []Site
	// Trace, when set, receives every event of every interleaving as one
	// line of text (use with one interleaving).
	Trace io.Writer
	// SQLiteShare is the share of interleavings (0..1, drawn per seed)
	// whose ledger runs on the real SQLite store in a temporary directory
	// instead of the memstore.
	SQLiteShare float64
	// PipelinedShare is the share of interleavings (0..1, drawn per seed)
	// whose ledger commits with pipelined durability: a batch is committed
	// without its fsync (engine.Core.CommitDeferred), its answers wait for
	// a simulated fsync (engine.Core.Sync) 0.2-5 ms later while the next
	// batches commit, and a crash before that fsync loses every batch
	// since the last one (on the memstore, in half of such crashes: the
	// other half the OS had kept the writes; on SQLite never, a killed
	// process's writes stay in the page cache).
	PipelinedShare float64
	// RecordShare is the share of the gateways' requests (0..1, drawn per
	// request) that take the path of a gateway that learns the cost only
	// from the response (Envoy AI Gateway's response-time cost): no
	// reservation; the gateway runs the work, then records its actual
	// usage with ledger.Record under a client-chosen id, retried with the
	// same id and usage after a lost answer, an "unavailable" or a
	// timeout. 0 leaves every interleaving as it was before records
	// existed (nothing is drawn for them).
	RecordShare float64
}

// DefaultRecordShare is the share of requests recorded after the fact
// (Config.RecordShare): enough for each interleaving to have a few records
// (about 3 of 17 requests) while reserve, start and settle stay the
// common path.
const DefaultRecordShare = 0.2

// DefaultConfig returns the sizes the gates run with.
func DefaultConfig() Config {
	return Config{
		Gateways:      4,
		Executors:     3,
		Tenants:       3,
		Requests:      6,
		ArrivalWindow: 2 * time.Minute,
		HealAt:        3 * time.Minute,
		Deadline:      30 * time.Minute,
		AuditEvery:    0,
		LastEvents:    40,
		RecordShare:   DefaultRecordShare,
	}
}

// Validate returns nil, or an error naming the first bad field.
// maxDims is how many capacity dimensions a shape may draw.
func (c *Config) maxDims() int {
	if c.TwoUnits {
		return 2
	}
	return 3
}

func (c *Config) Validate() error {
	switch {
	case c.Gateways < 2:
		return fmt.Errorf("gateways %d: at least 2", c.Gateways)
	case c.Executors < 1:
		return fmt.Errorf("executors %d: at least 1", c.Executors)
	case c.Tenants < 1:
		return fmt.Errorf("tenants %d: at least 1", c.Tenants)
	case c.Requests < 1:
		return fmt.Errorf("requests %d: at least 1", c.Requests)
	case c.ArrivalWindow <= 0:
		return fmt.Errorf("arrival window %s: must be positive", c.ArrivalWindow)
	case c.HealAt < c.ArrivalWindow:
		return fmt.Errorf("heal-at %s: not before the arrival window %s ends", c.HealAt, c.ArrivalWindow)
	case c.Deadline <= 0:
		return fmt.Errorf("deadline %s: must be positive", c.Deadline)
	case c.AuditEvery < 0:
		return fmt.Errorf("audit-every %d: negative", c.AuditEvery)
	case c.LastEvents < 0:
		return fmt.Errorf("last %d: negative", c.LastEvents)
	case !(c.SQLiteShare >= 0 && c.SQLiteShare <= 1):
		return fmt.Errorf("sqlite-share %v: outside [0, 1]", c.SQLiteShare)
	case !(c.PipelinedShare >= 0 && c.PipelinedShare <= 1):
		return fmt.Errorf("pipelined-share %v: outside [0, 1]", c.PipelinedShare)
	case !(c.RecordShare >= 0 && c.RecordShare <= 1):
		return fmt.Errorf("record-share %v: outside [0, 1]", c.RecordShare)
	}
	return nil
}

// Flags returns the command-line flags that reproduce c, leaving out the
// ones at their default (the part of a replay command after the seed).
func (c *Config) Flags() string {
	d := DefaultConfig()
	var b strings.Builder
	add := func(name string, value any) { fmt.Fprintf(&b, " --%s %v", name, value) }
	if c.Gateways != d.Gateways {
		add("gateways", c.Gateways)
	}
	if c.Executors != d.Executors {
		add("executors", c.Executors)
	}
	if c.Tenants != d.Tenants {
		add("tenants", c.Tenants)
	}
	if c.Requests != d.Requests {
		add("requests", c.Requests)
	}
	if c.ArrivalWindow != d.ArrivalWindow {
		add("arrival-window", c.ArrivalWindow)
	}
	if c.HealAt != d.HealAt {
		add("heal-at", c.HealAt)
	}
	if c.Deadline != d.Deadline {
		add("deadline", c.Deadline)
	}
	if c.AuditEvery != d.AuditEvery {
		add("audit-every", c.AuditEvery)
	}
	if c.SQLiteShare != d.SQLiteShare {
		add("sqlite-share", c.SQLiteShare)
	}
	if c.PipelinedShare != d.PipelinedShare {
		add("pipelined-share", c.PipelinedShare)
	}
	if c.RecordShare != d.RecordShare {
		add("record-share", c.RecordShare)
	}
	if len(c.Only) > 0 {
		names := make([]string, len(c.Only))
		for i, s := range c.Only {
			names[i] = s.String()
		}
		add("only", strings.Join(names, ","))
	}
	return b.String()
}

// ParseSites parses a comma-separated list of site names.
func ParseSites(list string) ([]Site, error) {
	var out []Site
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		found := false
		for s := Site(0); s < numSites; s++ {
			if siteNames[s] == name {
				out = append(out, s)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown fault site %q (known: %s)", name, strings.Join(siteNames[:], ", "))
		}
	}
	return out, nil
}
