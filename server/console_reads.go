package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The ConsoleService's reads of the store (console.proto): one subject's
// reservations by state, one account's statements, the resolver's last
// answers. Each answers a caller outside the subject's scope exactly as
// it answers for a subject, account or reservation that does not exist.

// oneSubjectProblem is the rule for a read of one subject's rows
// (GetAccount, ListSubjectReservations, ListStatements): "" for a subject
// it can name, else what is wrong, as a phrase that follows the field's
// name ("is required"). The subject is required and concrete:
// "*" names a policy for every subject, never an account or a reservation
// (Reserve and RecordUsage refuse it), so answering it with no rows would
// read as "this subject has none" where the caller meant "all of them".
func oneSubjectProblem(subject string) string {
	switch subject {
	case "":
		return "is required"
	case ledger.AnySubject:
		return fmt.Sprintf("%q names every subject; name a concrete one", ledger.AnySubject)
	}
	return ""
}

// subjectFilterProblem is the rule for a list's optional subject filter
// (ListUsageUnknown, ListShards): "" for none or a subject it can match,
// else what is wrong, as a phrase that follows the field's name. "*" is
// no pattern there: no reservation or shard has that subject, so matching
// it literally answered an empty list that read as "none" where the
// caller meant "every subject".
func subjectFilterProblem(subject string) string {
	if subject == ledger.AnySubject {
		return fmt.Sprintf("%q names every subject; leave subject out to list every subject", ledger.AnySubject)
	}
	return ""
}

// maxResolverAnswerIDs bounds GetResolverAnswers.
const maxResolverAnswerIDs = 1000

func (c consoleService) consoleStore() (store.ConsoleStore, *connect.Error) {
	if c.s.console.store == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this server keeps no console store"))
	}
	return c.s.console.store, nil
}

// ListSubjectReservations implements ConsoleService.ListSubjectReservations.
func (c consoleService) ListSubjectReservations(ctx context.Context, req *connect.Request[v1.ListSubjectReservationsRequest]) (*connect.Response[v1.ListSubjectReservationsResponse], error) {
	cs, cerr := c.consoleStore()
	if cerr != nil {
		return nil, cerr
	}
	m := req.Msg
	if problem := oneSubjectProblem(m.GetSubject()); problem != "" {
		return nil, invalidField(ReasonInvalidCommand, "subject", "%s", problem)
	}
	size, cerr := pageSize(m.GetPageSize())
	if cerr != nil {
		return nil, cerr
	}
	var states []ledger.State
	for _, pb := range m.GetStates() {
		st, ok := stateFromProto(pb)
		if !ok || !st.Stored() {
			return nil, invalidField(ReasonInvalidCommand, "states", ": %v is not a stored reservation state", pb)
		}
		states = append(states, st)
	}
	query := subjectQueryDigest(m.GetSubject(), states)
	plain, err := c.s.unsealPage(ctx, "ListSubjectReservations", m.GetPageToken())
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	before, err := parseSubjectToken(plain, query)
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	resp := &v1.ListSubjectReservationsResponse{}
	if c.s.filterOutOfScope(ctx, "list subject reservations", m.GetSubject(), "") {
		return connect.NewResponse(resp), nil // as for a subject without reservations
	}
	counts, err := cs.ReservationStatesOfSubject(ctx, m.GetSubject())
	if err != nil {
		return nil, readError("reservation states", ReasonStoreUnavailable, err)
	}
	for _, n := range counts.Counts {
		if InScope(ctx, m.GetSubject(), n.Route) {
			resp.Counts = append(resp.Counts, &v1.ReservationStateCount{Route: n.Route, State: stateToProto[n.State], Count: n.Count})
		}
	}
	for _, n := range counts.Retained {
		if InScope(ctx, m.GetSubject(), n.Account.Route) {
			resp.Retained += n.Reservations
		}
	}
	filter := store.SubjectFilter{Subject: m.GetSubject(), States: states, Before: before}
	// A token limited with routes= may see a subject whose other routes
	// hold most of its rows: reservationPage reads on past them, bounded.
	shown, next, err := reservationPage(ctx, size, func(limit int, after *store.SubjectCursor) ([]ledger.Reservation, error) {
		filter.Limit = limit
		if after != nil {
			filter.Before = *after
		}
		return cs.ReservationsOfSubject(ctx, filter)
	}, func(r *ledger.Reservation) store.SubjectCursor {
		return store.SubjectCursor{CreatedAt: r.CreatedAt, ID: r.ID}
	})
	if err != nil {
		return nil, readError("reservations of "+m.GetSubject(), ReasonStoreUnavailable, err)
	}
	if next != nil {
		resp.NextPageToken = c.s.sealNext(ctx, "ListSubjectReservations", subjectToken(*next, query))
	}
	for i := range shown {
		pb, err := c.s.reservationProto(ctx, &shown[i])
		if err != nil {
			return nil, readError("reservations of "+m.GetSubject(), ReasonPolicyNotFound, err)
		}
		resp.Reservations = append(resp.Reservations, pb)
	}
	return connect.NewResponse(resp), nil
}

// subjectToken encodes a cursor of ListSubjectReservations: "s", the
// creation time in Unix nanoseconds, the query's digest (subjectQueryDigest)
// and the id, base64url. The cursor alone is only a time and an id, which
// would page any subject: the digest binds the token to the subject and
// states it was issued for.
func subjectToken(c store.SubjectCursor, query string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("s" + strconv.FormatInt(c.CreatedAt.UnixNano(), 10) + "/" + query + "/" + c.ID))
}

// subjectQueryDigest names one query of ListSubjectReservations: the
// subject and the filter's states (as a set: order and repeats do not
// make another query).
func subjectQueryDigest(subject string, states []ledger.State) string {
	set := slices.Clone(states)
	slices.Sort(set)
	set = slices.Compact(set)
	parts := []string{subject}
	for _, st := range set {
		parts = append(parts, st.String())
	}
	return queryDigest(parts...)
}

// parseSubjectToken returns the cursor of token (the zero cursor for an
// empty one), errNotSubjectToken for a token this method did not issue,
// and errSubjectTokenOtherQuery for one issued for another subject or
// another states filter than query.
func parseSubjectToken(token, query string) (store.SubjectCursor, error) {
	if token == "" {
		return store.SubjectCursor{}, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || !strings.HasPrefix(string(raw), "s") {
		return store.SubjectCursor{}, errNotSubjectToken
	}
	nanos, rest, ok1 := strings.Cut(string(raw[1:]), "/")
	digest, id, ok2 := strings.Cut(rest, "/")
	n, err := strconv.ParseInt(nanos, 10, 64)
	if !ok1 || !ok2 || err != nil || n == 0 || len(digest) != len(query) || ledger.IDProblem(id) != "" {
		return store.SubjectCursor{}, errNotSubjectToken
	}
	if digest != query {
		return store.SubjectCursor{}, errSubjectTokenOtherQuery
	}
	return store.SubjectCursor{CreatedAt: time.Unix(0, n), ID: id}, nil
}

var errSubjectTokenOtherQuery = errors.New("issued for another subject or states filter: ask for the first page (no pageToken) when either changes")

var errNotSubjectToken = errors.New("not a nextPageToken of ListSubjectReservations")

// ListStatements implements ConsoleService.ListStatements.
func (c consoleService) ListStatements(ctx context.Context, req *connect.Request[v1.ListStatementsRequest]) (*connect.Response[v1.ListStatementsResponse], error) {
	cs, cerr := c.consoleStore()
	if cerr != nil {
		return nil, cerr
	}
	m := req.Msg
	if problem := oneSubjectProblem(m.GetSubject()); problem != "" {
		return nil, invalidField(ReasonInvalidCommand, "subject", "%s", problem)
	}
	// Generations start at 1: without one no account is named, and an
	// empty answer would read as "no statements".
	switch {
	case m.GetRoute() == "":
		return nil, invalidField(ReasonInvalidCommand, "route", "is required")
	case m.GetPolicyGeneration() == 0:
		return nil, invalidField(ReasonInvalidCommand, "policyGeneration", "is required")
	}
	size, cerr := pageSize(m.GetPageSize())
	if cerr != nil {
		return nil, cerr
	}
	key := ledger.AccountKey{Subject: m.GetSubject(), Route: m.GetRoute(), Region: regionOrDefault(m.GetRegion()), Generation: m.GetPolicyGeneration()}
	query := queryDigest(key.Subject, key.Route, key.Region, strconv.FormatUint(key.Generation, 10))
	plain, err := c.s.unsealPage(ctx, "ListStatements", m.GetPageToken())
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	before, err := parseStatementToken(plain, query)
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	resp := &v1.ListStatementsResponse{}
	if c.s.outOfScope(ctx, "list statements", key.Subject, key.Route, "", "") {
		return connect.NewResponse(resp), nil // as for an account without statements
	}
	list, err := cs.StatementsOf(ctx, store.StatementFilter{Account: key, Before: before, Limit: size + 1})
	if err != nil {
		return nil, readError("statements of "+key.String(), ReasonStoreUnavailable, err)
	}
	if len(list) > size {
		list = list[:size]
		resp.NextPageToken = c.s.sealNext(ctx, "ListStatements", statementToken(list[size-1].EpochStart, query))
	}
	if len(list) == 0 {
		return connect.NewResponse(resp), nil
	}
	p, cerr := c.s.Policy(ctx, key.Generation)
	if cerr != nil {
		return nil, cerr
	}
	for i := range list {
		st := &list[i]
		opening := &ledger.Account{Key: key, Dims: st.Dims, Balances: st.Opening}
		closing := &ledger.Account{Key: key, Dims: st.Dims, Balances: st.Closing}
		resp.Statements = append(resp.Statements, &v1.Statement{
			Subject: key.Subject, Route: key.Route, Region: key.Region, PolicyGeneration: key.Generation,
			EpochStart: timestamp(st.EpochStart), EpochEnd: timestamp(st.EpochEnd),
			Opening: accountProto(opening, &p).GetBalances(), Closing: accountProto(closing, &p).GetBalances(),
		})
	}
	return connect.NewResponse(resp), nil
}

// statementToken encodes a cursor of ListStatements: "e", the epoch
// start in Unix nanoseconds and the account's digest (queryDigest),
// base64url. The digest binds the token to the account it pages.
func statementToken(epochStart time.Time, query string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("e" + strconv.FormatInt(epochStart.UnixNano(), 10) + "/" + query))
}

// parseStatementToken returns the cursor of token (zero for an empty
// one), errNotStatementToken for a token this method did not issue and
// errStatementTokenOtherAccount for one issued for another account.
func parseStatementToken(token, query string) (time.Time, error) {
	if token == "" {
		return time.Time{}, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || !strings.HasPrefix(string(raw), "e") {
		return time.Time{}, errNotStatementToken
	}
	nanos, digest, ok := strings.Cut(string(raw[1:]), "/")
	n, err := strconv.ParseInt(nanos, 10, 64)
	if !ok || err != nil || n == 0 || len(digest) != len(query) {
		return time.Time{}, errNotStatementToken
	}
	if digest != query {
		return time.Time{}, errStatementTokenOtherAccount
	}
	return time.Unix(0, n), nil
}

var errStatementTokenOtherAccount = errors.New("issued for another account (subject, route, region or policyGeneration): ask for the first page (no pageToken) when it changes")

var errNotStatementToken = errors.New("not a nextPageToken of ListStatements")

// GetResolverAnswers implements ConsoleService.GetResolverAnswers.
func (c consoleService) GetResolverAnswers(ctx context.Context, req *connect.Request[v1.GetResolverAnswersRequest]) (*connect.Response[v1.GetResolverAnswersResponse], error) {
	cs, cerr := c.consoleStore()
	if cerr != nil {
		return nil, cerr
	}
	ids := req.Msg.GetReservationIds()
	switch {
	case len(ids) == 0:
		return nil, invalidField(ReasonInvalidCommand, "reservationIds", ": at least one id is required")
	case len(ids) > maxResolverAnswerIDs:
		return nil, invalidField(ReasonInvalidCommand, "reservationIds", ": %d given; at most %d", len(ids), maxResolverAnswerIDs)
	}
	// An empty (or over-long) id names no reservation: refused as every
	// other method refuses it, rather than answered as an id without an
	// answer, which would read as "not asked about yet".
	for i, id := range ids {
		if cerr := checkID(ledger.ItemPath("reservationIds", i), id); cerr != nil {
			return nil, cerr
		}
	}
	answers, err := cs.ResolverAnswersGet(ctx, ids)
	if err != nil {
		return nil, readError("resolver answers", ReasonStoreUnavailable, err)
	}
	resp := &v1.GetResolverAnswersResponse{}
	for _, a := range answers {
		// The answer names its account (the store returns an answer only
		// with the reservation of its account under the id): its scope is
		// that account's, read with it, so an id that changed hands since
		// cannot show one tenant another's answer.
		if c.s.outOfScope(ctx, "get resolver answers", a.Account.Subject, a.Account.Route, "reservation", a.ReservationID) {
			continue // as for a reservation without an answer
		}
		resp.Answers = append(resp.Answers, &v1.ResolverAnswer{
			ReservationId: a.ReservationID, Answer: a.Answer, Detail: a.Detail, AskedAt: timestamp(a.AskedAt),
			Attempts: a.Attempts, NextAttemptAt: timestamp(a.NextAt),
			Subject: a.Account.Subject, Route: a.Account.Route, Region: a.Account.Region,
		})
	}
	return connect.NewResponse(resp), nil
}
