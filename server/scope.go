package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Scope limits a token to some subjects and routes. Each list holds
// patterns: `*` matches any run of characters (slashes included) and `?`
// one character, anything else itself, so `tenant-b/*` is a prefix and
// `chat.*` every route under chat. An empty list does not limit (every
// subject, or every route): an unscoped token has no limits at all.
type Scope struct {
	Subjects []string
	Routes   []string
}

// Unlimited reports whether the scope limits nothing.
func (sc Scope) Unlimited() bool { return len(sc.Subjects) == 0 && len(sc.Routes) == 0 }

// Covers reports whether the scope admits subject on route. A wildcard
// policy's subject (`*`, ledger.AnySubject) is covered only by a scope
// without subject limits: a scoped token sees a wildcard policy through
// ListPolicies (route permitting) but never acts for "every subject".
func (sc Scope) Covers(subject, route string) bool {
	return matchesAny(sc.Subjects, subject) && matchesAny(sc.Routes, route)
}

// coversPolicy reports whether a policy of key is visible in the scope: its
// route is covered and its subject is, or it is the wildcard subject.
func (sc Scope) coversPolicy(key ledger.PolicyKey) bool {
	if !matchesAny(sc.Routes, key.Route) {
		return false
	}
	return key.Subject == ledger.AnySubject || matchesAny(sc.Subjects, key.Subject)
}

func (sc Scope) String() string {
	var parts []string
	if len(sc.Subjects) > 0 {
		parts = append(parts, "subjects="+strings.Join(sc.Subjects, ","))
	}
	if len(sc.Routes) > 0 {
		parts = append(parts, "routes="+strings.Join(sc.Routes, ","))
	}
	if len(parts) == 0 {
		return "unscoped"
	}
	return strings.Join(parts, " ")
}

func matchesAny(patterns []string, s string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if globMatch(p, s) {
			return true
		}
	}
	return false
}

// globMatch matches s against pattern: `*` any run of characters, `?` one
// character (one UTF-8 encoded rune, not one byte: `t-?/*` covers `t-é/x`,
// and `t-??/*` does not), everything else literally. (path.Match would
// stop `*` at a slash, and subjects such as `tenant-b/team-1/user-9` nest.)
// Literal characters compare byte by byte, which for UTF-8 is the same as
// rune by rune; the wildcards step over whole runes.
func globMatch(pattern, s string) bool {
	px, sx := 0, 0
	star, mark := -1, 0
	for sx < len(s) {
		if px < len(pattern) {
			switch c := pattern[px]; {
			case c == '*':
				star, mark = px, sx
				px++
				continue
			case c == '?':
				_, n := utf8.DecodeRuneInString(s[sx:])
				px++
				sx += n
				continue
			case c == s[sx]:
				px++
				sx++
				continue
			}
		}
		if star < 0 {
			return false
		}
		_, n := utf8.DecodeRuneInString(s[mark:])
		px = star + 1
		mark += n
		sx = mark
	}
	for px < len(pattern) && pattern[px] == '*' {
		px++
	}
	return px == len(pattern)
}

// parseScope reads `subjects=a,b` and `routes=c` fields of a tokens file
// line.
func parseScope(fields []string) (Scope, error) {
	var sc Scope
	seen := map[string]bool{}
	for _, f := range fields {
		name, value, ok := strings.Cut(f, "=")
		if !ok || (name != "subjects" && name != "routes") {
			return sc, fmt.Errorf("%q: want subjects=PATTERN[,PATTERN...] or routes=PATTERN[,PATTERN...]", f)
		}
		if seen[name] {
			return sc, fmt.Errorf("%s given twice", name)
		}
		seen[name] = true
		patterns := strings.Split(value, ",")
		for _, p := range patterns {
			if p == "" {
				return sc, fmt.Errorf("%s: empty pattern", name)
			}
			// Matching steps over runes: a pattern that is not UTF-8 (a
			// tokens file saved in Latin-1) could match part of another
			// character of a subject, so it is refused, not guessed at.
			if !utf8.ValidString(p) {
				return sc, fmt.Errorf("%s: pattern %q is not valid UTF-8", name, p)
			}
		}
		if name == "subjects" {
			sc.Subjects = patterns
		} else {
			sc.Routes = patterns
		}
	}
	return sc, nil
}

// InScope reports whether the caller of ctx may touch subject on route:
// true when auth is off, for an unscoped token (admin tokens are never
// scoped), and for a scoped one whose patterns cover both. It is the one
// tenant-isolation check: every handler that names a subject, or reads a
// stored reservation, account or shard, asks it before answering, and a
// client of the public API (the console) asks it the same way.
func InScope(ctx context.Context, subject, route string) bool {
	id, ok := IdentityFrom(ctx)
	return !ok || id.Scope.Covers(subject, route)
}

// scoped reports whether the caller's token is limited by a scope (then
// id-only calls read the stored row first, to check its subject).
func scoped(ctx context.Context) bool {
	id, ok := IdentityFrom(ctx)
	return ok && !id.Scope.Unlimited()
}

// reservationNotFound is the answer to a scoped caller for an id that does
// not exist and, identically, for one whose reservation lies outside its
// scope: a refusal must not reveal that the id exists.
func reservationNotFound(_, id string) *connect.Error {
	return notFound(ReasonReservationNotFound, id)
}

// outOfScope is the one out-of-scope rule: it reports whether the caller
// of ctx may not touch subject on route (InScope), and logs every such
// refusal at INFO with call and the token's name (API.md,
// "Authentication"; OPERATIONS.md). The log names what was refused: kind
// and id (a "reservation" or "shard" id) when kind is set, else the
// subject and route. Every handler that refuses something outside the
// scope asks it (directly or through the answers below), then answers as
// for something that does not exist, or as a taken id; the filters of
// lists (scopeFilter) leave rows out silently.
func (s *Server) outOfScope(ctx context.Context, call, subject, route, kind, id string) bool {
	if InScope(ctx, subject, route) {
		return false
	}
	if kind != "" {
		s.logOutOfScope(ctx, call, kind, id)
	} else {
		s.logOutOfScope(ctx, call, "subject", subject, "route", route)
	}
	return true
}

// subjectOutOfScope is the answer to a call naming key's subject and
// route outside the caller's scope (Reserve, RecordUsage, IssueShard):
// NO_POLICY, as for a subject no policy admits, which is what it is for
// this caller; nil in the scope.
func (s *Server) subjectOutOfScope(ctx context.Context, call string, key ledger.PolicyKey) *connect.Error {
	if s.outOfScope(ctx, call, key.Subject, key.Route, "", "") {
		return noPolicy(key)
	}
	return nil
}

// filterOutOfScope is outOfScope for a list filtered on a subject or a
// route, either left empty for "any" (ConsoleService.ListSubjectReservations,
// LedgerService.ListUsageUnknown): true, and logged, when the caller's
// scope admits no row the filters select. Such a list is answered as one
// whose filters select no row, without reading: reading on past the rows
// it may not show would answer an empty page with a next page token
// where another tenant has rows, and none where it has none.
func (s *Server) filterOutOfScope(ctx context.Context, call, subject, route string) bool {
	id, ok := IdentityFrom(ctx)
	if !ok || (subject == "" || matchesAny(id.Scope.Subjects, subject)) && (route == "" || matchesAny(id.Scope.Routes, route)) {
		return false
	}
	s.logOutOfScope(ctx, call, "subject", subject, "route", route)
	return true
}

// storedOutOfScope is the scope check of a call that reads a stored row
// (a reservation or a shard, kind) by id: for a scoped caller, notFound
// (reservationNotFound, shardNotFound) when the row is outside the scope
// (logged) or missing (err is store.ErrNotFound; not a refusal), the
// same answer, so a refusal does not reveal that the id exists; nil
// otherwise: when the caller is unscoped, the row is in its scope, or
// the read failed for another reason (err, for the caller to answer).
func (s *Server) storedOutOfScope(ctx context.Context, call, kind, id string, account ledger.AccountKey, err error,
	notFound func(what, id string) *connect.Error) *connect.Error {
	if !scoped(ctx) {
		return nil
	}
	if err == nil && s.outOfScope(ctx, call, account.Subject, account.Route, kind, id) || isNotFound(err) {
		return notFound(call, id)
	}
	return nil
}

// checkReservationScope is the scope check of an id-only call. It
// returns the account of the stored reservation it checked, for the
// command to carry as its ledger.Command.CheckedAccount: the ledger then
// refuses, as an unknown id, a reservation that took the id after this
// check (retention forgot the caller's, another tenant reused the id), so
// isolation does not rest on nothing happening between the read and the
// command. The zero key when the caller is unscoped (nothing read,
// nothing to check); reservationNotFound when the reservation is missing
// or outside the scope; a read error when the store cannot say.
func (s *Server) checkReservationScope(ctx context.Context, what, id string) (ledger.AccountKey, *connect.Error) {
	if !scoped(ctx) {
		return ledger.AccountKey{}, nil
	}
	r, err := s.ledger.Reservation(ctx, id)
	if cerr := s.storedOutOfScope(ctx, what, "reservation", id, r.Account, err, reservationNotFound); cerr != nil {
		return ledger.AccountKey{}, cerr
	}
	if err != nil {
		return ledger.AccountKey{}, notSentError(what+" "+id, ReasonReservationNotFound, named(err, "reservation", id))
	}
	return r.Account, nil
}

// scopeFilter returns the filter of a list for the caller of ctx: true
// for the accounts in its scope (InScope), nil when the caller is
// unscoped (nothing to leave out). Rows left out are not refusals and
// are not logged.
func scopeFilter(ctx context.Context) func(ledger.AccountKey) bool {
	if !scoped(ctx) {
		return nil
	}
	return func(k ledger.AccountKey) bool { return InScope(ctx, k.Subject, k.Route) }
}

// logOutOfScope logs a refusal of a call for touching something outside
// the caller's token scope (answered as if it did not exist), at INFO
// with the token's name: attrs name what was refused. Called by
// outOfScope and by the checks that are not of one subject and route
// (GetPolicy's policies, a subject on any route).
func (s *Server) logOutOfScope(ctx context.Context, call string, attrs ...any) {
	args := append([]any{"call", call}, attrs...)
	s.log.Info("out of the token's scope", append(args, "token", tokenName(ctx))...)
}

// idTaken answers a Reserve or RecordUsage whose id another tenant's
// reservation holds: the id is taken, and nothing else is said.
func idTaken() *connect.Error {
	return withReason(connect.NewError(connect.CodeAlreadyExists, ledger.ErrDigestMismatch), ReasonDigestMismatch)
}

func tokenName(ctx context.Context) string {
	id, _ := IdentityFrom(ctx)
	return id.Name
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// inPolicyScope reports whether the caller may see a policy of key (see
// Scope.coversPolicy; true when auth is off or the token is unscoped).
func inPolicyScope(ctx context.Context, key ledger.PolicyKey) bool {
	id, ok := IdentityFrom(ctx)
	return !ok || id.Scope.coversPolicy(key)
}

// shardNotFound is reservationNotFound for shards.
func shardNotFound(_, id string) *connect.Error {
	return notFound(ReasonShardNotFound, id)
}

// shardIDTaken answers an IssueShard whose shard id is another tenant's
// exactly as the ledger answers a reuse of one's own (ledger.IssueShard:
// ErrShardIDReused naming the caller's id), so the two read alike.
func shardIDTaken(shardID string) *connect.Error {
	return withReason(connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%w: %s", ledger.ErrShardIDReused, shardID)), ReasonShardIDReused)
}
