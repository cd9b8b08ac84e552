package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The USAGE_UNKNOWN backlog: started work whose usage nobody reported. Its
// capacity stays reserved until an operation receipt settles it, so a
// backlog that grows shrinks tenants' usable capacity, and the spec's
// release gate wants it resolved within minutes. Operators see it in two
// places: the admin method ListUsageUnknown, to find the reservations to
// resolve, and two gauges, to alert on.

// The page sizes of the list methods (ListUsageUnknown, ListDebts).
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// pageSize checks a list request's page_size; 0 means the default.
func pageSize(n int32) (int, *connect.Error) {
	switch {
	case n < 0 || n > maxPageSize:
		return 0, invalidField(ReasonInvalidCommand, "pageSize", "%d: want 1 to %d (0 for %d)", n, maxPageSize, defaultPageSize)
	case n == 0:
		return defaultPageSize, nil
	}
	return int(n), nil
}

// ListUsageUnknown implements LedgerService.ListUsageUnknown.
func (s *Server) ListUsageUnknown(ctx context.Context, req *connect.Request[v1.ListUsageUnknownRequest]) (*connect.Response[v1.ListUsageUnknownResponse], error) {
	if problem := subjectFilterProblem(req.Msg.GetSubject()); problem != "" {
		return nil, invalidField(ReasonInvalidCommand, "subject", "%s", problem)
	}
	size, cerr := pageSize(req.Msg.GetPageSize())
	if cerr != nil {
		return nil, cerr
	}
	query := queryDigest(req.Msg.GetSubject(), req.Msg.GetRoute())
	plain, err := s.unsealPage(ctx, "ListUsageUnknown", req.Msg.GetPageToken())
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	after, err := parseUnknownToken(plain, query)
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	var rows []ledger.Reservation
	var next *store.UnknownCursor
	if !s.filterOutOfScope(ctx, "list usage unknown", req.Msg.GetSubject(), req.Msg.GetRoute()) {
		filter := store.UnknownFilter{Subject: req.Msg.GetSubject(), Route: req.Msg.GetRoute(), After: after}
		rows, next, err = reservationPage(ctx, size, func(limit int, after *store.UnknownCursor) ([]ledger.Reservation, error) {
			filter.Limit = limit
			if after != nil {
				filter.After = *after
			}
			return s.ledger.ReservationsUnknown(ctx, filter)
		}, func(r *ledger.Reservation) store.UnknownCursor {
			return store.UnknownCursor{MarkedAt: r.UnknownAt, ID: r.ID}
		})
		if err != nil {
			return nil, readError("list usage unknown", ReasonStoreUnavailable, err)
		}
	}
	backlog, err := s.ledger.UnknownBacklog(ctx)
	if err != nil {
		return nil, readError("usage unknown backlog", ReasonStoreUnavailable, err)
	}
	resp := &v1.ListUsageUnknownResponse{Backlog: backlog.Count, OldestUsageUnknownAt: timestamp(backlog.OldestMarkedAt)}
	if scoped(ctx) {
		// The store-wide figures span tenants outside the token's scope.
		resp.Backlog, resp.OldestUsageUnknownAt = 0, nil
	}
	// The cursor (the last row shown, or for a scoped caller examined, in
	// the store's order) was taken before overdue ones move to the front.
	if next != nil {
		resp.NextPageToken = s.sealNext(ctx, "ListUsageUnknown", unknownToken(*next, query))
	}
	if s.resolver != nil {
		resp.ResolverConfigured = true
		resp.OverdueReservationIds = overdueFirst(s.resolver, rows, s.clock())
		stats := s.resolver.ResolverStats()
		// Without a complete scan by this replica as worker leader
		// overdue counts nothing (the metric is left out):
		// resolverScanned tells that 0 apart.
		resp.ResolverScanned = stats.Scanned
		if !scoped(ctx) { // store-wide, as the backlog
			resp.Overdue = stats.Overdue
		}
	}
	for i := range rows {
		pb, err := s.reservationProto(ctx, &rows[i])
		if err != nil {
			return nil, readError("list usage unknown", ReasonPolicyNotFound, err)
		}
		resp.Reservations = append(resp.Reservations, pb)
	}
	return connect.NewResponse(resp), nil
}

// unknownToken encodes a cursor as an opaque page token: the time of the
// marking in Unix nanoseconds, the filters' digest (queryDigest) and the
// id, base64url. The digest binds the token to the filters it pages.
func unknownToken(c store.UnknownCursor, query string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.MarkedAt.UnixNano(), 10) + "/" + query + "/" + c.ID))
}

// parseUnknownToken returns the cursor of token (zero for an empty one),
// errNotOurToken for a token this method did not issue and
// errUnknownTokenOtherFilter for one issued for other filters.
func parseUnknownToken(token, query string) (store.UnknownCursor, error) {
	if token == "" {
		return store.UnknownCursor{}, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return store.UnknownCursor{}, errNotOurToken
	}
	nanos, rest, ok1 := strings.Cut(string(raw), "/")
	digest, id, ok2 := strings.Cut(rest, "/")
	n, err := strconv.ParseInt(nanos, 10, 64)
	// 0 is the Unix epoch, which the stores refuse as a cursor (it reads
	// back as the zero time) and no marked reservation holds: left to
	// the store, it would answer UNAVAILABLE instead of a bad token.
	if !ok1 || !ok2 || err != nil || n == 0 || len(digest) != len(query) || ledger.IDProblem(id) != "" {
		return store.UnknownCursor{}, errNotOurToken
	}
	if digest != query {
		return store.UnknownCursor{}, errUnknownTokenOtherFilter
	}
	return store.UnknownCursor{MarkedAt: time.Unix(0, n), ID: id}, nil
}

var errUnknownTokenOtherFilter = errors.New("issued for another subject or route filter: ask for the first page (no pageToken) when either changes")

// queryDigest names the query a page token belongs to: the first 8 bytes
// of SHA-256 over its parts (each length-prefixed), in hex. The list
// methods whose cursor is a position only (a time and an id) write it
// into their tokens and refuse a token of another query, which would
// page another subject, account or filter from a foreign position.
func queryDigest(parts ...string) string {
	h := sha256.New()
	for _, part := range parts {
		h.Write(binary.AppendUvarint(nil, uint64(len(part))))
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

var errNotOurToken = errors.New("not a nextPageToken of ListUsageUnknown")

// backlogCacheFor is how long one reading of the backlog serves scrapes:
// several Prometheus servers (or a scrape and a dashboard) then cost one
// store query, and the figure is at most this stale.
const backlogCacheFor = 5 * time.Second

// backlogTimeout bounds the store query of one reading, so a slow store
// delays a scrape by at most this long.
const backlogTimeout = 2 * time.Second

// backlogCollector exports the USAGE_UNKNOWN backlog as two gauges, read
// from the store when scraped (at most once per backlogCacheFor). On
// PostgreSQL every replica reports the same store-wide figure: aggregate
// with max, not sum. When the store cannot be read the gauges are left out
// of that scrape (and the error logged), so an alert on them sees no data
// instead of a false zero.
type backlogCollector struct {
	ledger Ledger
	log    *slog.Logger
	clock  func() time.Time
	count  *prometheus.Desc
	age    *prometheus.Desc

	mu     sync.Mutex
	readAt time.Time
	last   store.UnknownBacklog
	err    error
}

func (m *Metrics) registerBacklog(l Ledger, log *slog.Logger, clock func() time.Time) {
	m.registry.MustRegister(&backlogCollector{
		ledger: l, log: log, clock: clock,
		count: prometheus.NewDesc("capledger_usage_unknown_reservations",
			"Reservations in USAGE_UNKNOWN (started, usage not reported), store-wide; their capacity stays reserved until settled.", nil, nil),
		age: prometheus.NewDesc("capledger_usage_unknown_oldest_age_seconds",
			"Seconds since the longest-waiting USAGE_UNKNOWN reservation was marked unknown; 0 when there is none.", nil, nil),
	})
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.count
	ch <- c.age
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	backlog, now, err := c.read()
	if err != nil {
		return
	}
	age := 0.0
	if backlog.Count > 0 {
		age = max(now.Sub(backlog.OldestMarkedAt).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(backlog.Count))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
}

// read returns the backlog, from the cache when it is fresh enough.
func (c *backlogCollector) read() (store.UnknownBacklog, time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock()
	if c.readAt.IsZero() || now.Sub(c.readAt) >= backlogCacheFor {
		ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
		c.last, c.err = c.ledger.UnknownBacklog(ctx)
		cancel()
		c.readAt = now
		if c.err != nil {
			c.log.Warn("metrics: cannot read the USAGE_UNKNOWN backlog", "err", c.err)
		}
	}
	return c.last, now, c.err
}
