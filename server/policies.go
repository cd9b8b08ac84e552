package server

import (
	"context"
	"encoding/base64"
	"errors"
	"math"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// ListPolicies implements LedgerService.ListPolicies: a page of the
// published generations the filters select, oldest first. Each page is
// one store read of at most pageSize+1 rows with their keys' heads (a
// scoped caller's: at most maxScopedScanPages of them), however many
// policies there are; it used to read and answer every policy, 43 MB
// at 100,000 of them.
func (s *Server) ListPolicies(ctx context.Context, req *connect.Request[v1.ListPoliciesRequest]) (*connect.Response[v1.ListPoliciesResponse], error) {
	m := req.Msg
	size, cerr := pageSize(m.GetPageSize())
	if cerr != nil {
		return nil, cerr
	}
	query := queryDigest(m.GetSubject(), m.GetRoute(), m.GetRegion())
	plain, err := s.unsealPage(ctx, "ListPolicies", m.GetPageToken())
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	after, err := parsePolicyToken(plain, query)
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	resp := &v1.ListPoliciesResponse{}
	if !policyFilterInScope(ctx, m.GetSubject(), m.GetRoute()) {
		// No policy the filters select is visible to the caller: none,
		// without reading (reading on past them would page through other
		// tenants' policies to answer nothing).
		return connect.NewResponse(resp), nil
	}
	filter := store.PolicyFilter{Subject: m.GetSubject(), Route: m.GetRoute(), Region: m.GetRegion(), After: after}
	// Whether a generation is active is its key's head's word, read with
	// the page: the page alone cannot tell, its key's newer generations
	// being on later pages.
	rows, next, err := scopedPage(ctx, size, func(limit int, cursor *uint64) ([]store.ListedPolicy, error) {
		filter.Limit = limit
		if cursor != nil {
			filter.After = *cursor
		}
		return s.ledger.PoliciesPage(ctx, filter)
	}, func(l *store.ListedPolicy) uint64 { return l.Policy.Generation }, func(l *store.ListedPolicy) bool { return inPolicyScope(ctx, l.Policy.Key) })
	if err != nil {
		return nil, readError("list policies", ReasonStoreUnavailable, err)
	}
	for i := range rows {
		resp.Policies = append(resp.Policies, s.policyWithModeNow(ctx, &rows[i].Policy, rows[i].Active))
	}
	if next != nil {
		resp.NextPageToken = s.sealNext(ctx, "ListPolicies", policyToken(*next, query))
	}
	return connect.NewResponse(resp), nil
}

// policyFilterInScope reports whether the caller's scope can see a
// policy that ListPolicies' subject and route filters select (each empty
// for any): a wildcard subject's policies are visible to every scope
// whose routes allow them (Scope.coversPolicy).
func policyFilterInScope(ctx context.Context, subject, route string) bool {
	id, ok := IdentityFrom(ctx)
	if !ok {
		return true
	}
	return (subject == "" || subject == ledger.AnySubject || matchesAny(id.Scope.Subjects, subject)) &&
		(route == "" || matchesAny(id.Scope.Routes, route))
}

// policyToken encodes a ListPolicies cursor, the last generation
// examined, with the digest of the filters it belongs to (queryDigest).
func policyToken(generation uint64, query string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatUint(generation, 10) + "/" + query))
}

// parsePolicyToken returns the generation of token (0, the first page,
// for an empty one), errNotPolicyToken for a token this method did not
// issue and errPolicyTokenOtherFilter for one issued for other filters.
func parsePolicyToken(token, query string) (uint64, error) {
	if token == "" {
		return 0, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return 0, errNotPolicyToken
	}
	number, digest, ok := strings.Cut(string(raw), "/")
	generation, err := strconv.ParseUint(number, 10, 64)
	// 0 is no generation, and none above math.MaxInt64 is stored.
	if !ok || err != nil || generation == 0 || generation > math.MaxInt64 || len(digest) != len(query) {
		return 0, errNotPolicyToken
	}
	if digest != query {
		return 0, errPolicyTokenOtherFilter
	}
	return generation, nil
}

var (
	errNotPolicyToken         = errors.New("not a nextPageToken of ListPolicies")
	errPolicyTokenOtherFilter = errors.New("issued for another subject, route or region filter: ask for the first page (no pageToken) when any changes")
)
