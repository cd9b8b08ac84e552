package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"connectrpc.com/connect"

	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/ledger"
)

// Role is what a token may do.
type Role string

const (
	// RoleGateway may reserve, start, settle, release, mark usage unknown,
	// and read reservations, policies and accounts; on the ShardService it
	// may issue and reconcile shards only for the gateway id equal to its
	// token's name (see authorizeGateway).
	RoleGateway Role = "gateway"
	// RoleAdmin may do everything; it alone publishes and rolls back
	// policies and reads audits.
	RoleAdmin Role = "admin"
	// RoleViewer may only read: reservations, accounts, policies, shards
	// and the cross-tenant reads (crossTenantReads). It writes nothing.
	RoleViewer Role = "viewer"
)

// adminOnly are the procedures only the admin role may call.
var adminOnly = map[string]bool{
	capledgerv1connect.LedgerServicePublishPolicyProcedure:  true,
	capledgerv1connect.LedgerServiceRollbackPolicyProcedure: true,
	capledgerv1connect.LedgerServiceAuditProcedure:          true,
	// Rollout changes and rollbacks are the operator's (rollout.proto).
	capledgerv1connect.RolloutServiceCreateRolloutProcedure:       true,
	capledgerv1connect.RolloutServiceSetRolloutShareProcedure:     true,
	capledgerv1connect.RolloutServiceUndoRolloutStepProcedure:     true,
	capledgerv1connect.RolloutServiceEndRolloutProcedure:          true,
	capledgerv1connect.RolloutServiceRollbackGenerationsProcedure: true,
	capledgerv1connect.RolloutServiceCarveLegacyBudgetProcedure:   true,
	capledgerv1connect.AuditServiceStreamAuditProcedure:           true,
}

// crossTenantReads are the reads whose answers span tenants: the
// USAGE_UNKNOWN backlog, the debts list, the console's figures and the
// rollouts. A viewer may call them (a scoped viewer sees only its scope's
// rows, or is refused where rows cannot be told apart by tenant); a
// gateway may not. Listed once, for both roles.
var crossTenantReads = []string{
	capledgerv1connect.LedgerServiceListUsageUnknownProcedure,
	capledgerv1connect.LedgerServiceListDebtsProcedure,
	capledgerv1connect.ConsoleServiceGetOverviewProcedure,
	capledgerv1connect.ConsoleServiceListAccountStandingsProcedure,
	capledgerv1connect.ConsoleServiceGetFairnessProcedure,
	capledgerv1connect.ConsoleServiceListSubjectReservationsProcedure,
	capledgerv1connect.ConsoleServiceListStatementsProcedure,
	capledgerv1connect.ConsoleServiceGetResolverAnswersProcedure,
	capledgerv1connect.RolloutServiceGetRolloutProcedure,
	capledgerv1connect.RolloutServiceListRolloutsProcedure,
	capledgerv1connect.RolloutServiceShadowReportProcedure,
	capledgerv1connect.RolloutServiceDrainProgressProcedure,
}

// viewerMay are the procedures of the viewer role (reads only): one
// tenant's reads and the cross-tenant ones.
var viewerMay = procedureSet(append([]string{
	capledgerv1connect.LedgerServiceGetPolicyProcedure,
	capledgerv1connect.LedgerServiceListPoliciesProcedure,
	capledgerv1connect.LedgerServiceGetReservationProcedure,
	capledgerv1connect.LedgerServiceGetAccountProcedure,
	capledgerv1connect.ShardServiceGetShardProcedure,
	capledgerv1connect.ShardServiceListShardsProcedure,
	capledgerv1connect.ShardServiceListShardKeysProcedure,
}, crossTenantReads...))

// gatewayMayNot are the procedures beyond adminOnly a gateway may not call.
var gatewayMayNot = procedureSet(crossTenantReads)

func procedureSet(procedures []string) map[string]bool {
	set := make(map[string]bool, len(procedures))
	for _, p := range procedures {
		set[p] = true
	}
	return set
}

// RoleMay reports whether role may call procedure (a full procedure name,
// e.g. capledgerv1connect.LedgerServiceReserveProcedure).
func RoleMay(role Role, procedure string) bool {
	switch role {
	case RoleAdmin:
		return true
	case RoleGateway:
		return !adminOnly[procedure] && !gatewayMayNot[procedure]
	case RoleViewer:
		return viewerMay[procedure]
	}
	return false
}

// Identity is who presented a token: its name, its role and its scope
// (the subjects and routes it may touch; unlimited for admin tokens and
// for tokens without scope fields).
type Identity struct {
	Name  string
	Role  Role
	Scope Scope
	// token is the SHA-256 of the token presented: what page tokens are
	// bound to (sealNext), since names need not be unique (a rotation
	// gives a new token the old one's name).
	token [sha256.Size]byte
}

type tokenEntry struct {
	digest [sha256.Size]byte
	id     Identity
}

// Tokens is a set of bearer tokens with their roles.
type Tokens struct {
	entries []tokenEntry
}

// LoadTokens reads a tokens file: one `token role name` per line, role
// gateway, viewer or admin, optionally followed (gateway and viewer) by
// `subjects=PATTERN,...` and `routes=PATTERN,...` (see Scope); blank lines
// and lines starting with # are ignored. It
// returns an error naming the line for a malformed one, a duplicate token,
// or a file without any token (which would lock everybody out while
// looking like auth is on).
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	defer f.Close()
	tokens, err := ParseTokens(f)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return tokens, nil
}

// ParseTokens parses the tokens file format of LoadTokens.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{}
	seen := map[[sha256.Size]byte]bool{}
	scanner := bufio.NewScanner(r)
	for line := 1; scanner.Scan(); line++ {
		text := strings.TrimSpace(scanner.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) < 3 {
			return nil, fmt.Errorf("line %d: want `token role name [subjects=PATTERNS] [routes=PATTERNS]`, got %d fields", line, len(fields))
		}
		role := Role(fields[1])
		if role != RoleGateway && role != RoleAdmin && role != RoleViewer {
			return nil, fmt.Errorf("line %d: role %q is not %q, %q or %q", line, role, RoleGateway, RoleViewer, RoleAdmin)
		}
		scope, err := parseScope(fields[3:])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if role == RoleAdmin && !scope.Unlimited() {
			return nil, fmt.Errorf("line %d: an admin token cannot be scoped (give it the gateway or viewer role)", line)
		}
		if len(fields[0]) < 16 {
			return nil, fmt.Errorf("line %d: token shorter than 16 characters", line)
		}
		digest := sha256.Sum256([]byte(fields[0]))
		if seen[digest] {
			return nil, fmt.Errorf("line %d: token appears twice", line)
		}
		seen[digest] = true
		t.entries = append(t.entries, tokenEntry{digest: digest, id: Identity{Name: fields[2], Role: role, Scope: scope, token: digest}})
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	if len(t.entries) == 0 {
		return nil, errors.New("no tokens")
	}
	return t, nil
}

// lookup returns the identity of token. It compares digests (fixed length,
// so the token's length does not leak) in constant time against every
// entry, without stopping early, so timing reveals neither which entry
// matched nor how much of a guess was right.
func (t *Tokens) lookup(token string) (Identity, bool) {
	digest := sha256.Sum256([]byte(token))
	var found Identity
	match := 0
	for i := range t.entries {
		eq := subtle.ConstantTimeCompare(digest[:], t.entries[i].digest[:])
		if eq == 1 {
			found = t.entries[i].id
		}
		match |= eq
	}
	return found, match == 1
}

type identityKey struct{}

// IdentityFrom returns the caller's identity (ok false when auth is off).
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// authCheck is the interceptor that checks the bearer token and the role
// for every call. Missing or unknown token: UNAUTHENTICATED (401); a
// gateway token on an admin procedure: PERMISSION_DENIED (403). Unary
// calls and streaming handlers (AuditService.StreamAudit) pass the same
// check.
type authCheck struct{ tokens *Tokens }

// authorize returns the caller's identity, or the error to answer.
// authorization is the request's Authorization header value. The connect
// interceptor and the grpc-go path (grpcUnary) both call it.
func (a *authCheck) authorize(authorization, procedure string) (Identity, error) {
	token, ok := bearerToken(authorization)
	if !ok && strings.TrimSpace(authorization) != "" {
		// Another scheme (Basic, a bare token): say so, without echoing
		// the header, which may hold a credential.
		return Identity{}, withReason(connect.NewError(connect.CodeUnauthenticated,
			errors.New("the Authorization header holds no bearer token: send `Authorization: Bearer <token>`")), ReasonUnauthenticated)
	}
	if !ok {
		return Identity{}, withReason(connect.NewError(connect.CodeUnauthenticated,
			errors.New("missing bearer token: send `Authorization: Bearer <token>`")), ReasonUnauthenticated)
	}
	id, ok := a.tokens.lookup(token)
	if !ok {
		return Identity{}, withReason(connect.NewError(connect.CodeUnauthenticated, errors.New("unknown token")), ReasonUnauthenticated)
	}
	if !RoleMay(id.Role, procedure) {
		return Identity{}, withReason(connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("%s is not open to the %s role (token %q)", procedure, id.Role, id.Name)), ReasonPermissionDenied)
	}
	return id, nil
}

func (a *authCheck) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		id, err := a.authorize(req.Header().Get("Authorization"), req.Spec().Procedure)
		if err != nil {
			return nil, err
		}
		return next(context.WithValue(ctx, identityKey{}, id), req)
	}
}

func (a *authCheck) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a *authCheck) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		id, err := a.authorize(conn.RequestHeader().Get("Authorization"), conn.Spec().Procedure)
		if err != nil {
			return err
		}
		return next(context.WithValue(ctx, identityKey{}, id), conn)
	}
}

// bearerToken returns the token of an Authorization header value. The
// scheme is case-insensitive (RFC 7235: `Bearer`, `bearer`, `BEARER`) and
// may be followed by several spaces; ok is false for another scheme or no
// token.
func bearerToken(header string) (string, bool) {
	scheme, token, found := strings.Cut(strings.TrimSpace(header), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authorizeGateway ties a shard call's gateway id to the caller: with auth
// on, a gateway-role token may issue or reconcile shards only for the
// gateway id equal to its token's name, because a shard is spendable by
// the gateway it names, and one gateway acting for another could carve or
// settle capacity that is not its own. It returns nil when auth is off,
// for an admin token (operators reconcile a stopped gateway's shards), and
// for a gateway token whose name is gatewayID; PERMISSION_DENIED (403)
// with reason PERMISSION_DENIED otherwise.
func authorizeGateway(ctx context.Context, procedure, gatewayID string) *connect.Error {
	id, ok := IdentityFrom(ctx)
	if !ok || id.Role == RoleAdmin || id.Name == gatewayID || gatewayID == ledger.LegacyGateway(id.Name) {
		// A legacy limiter's token acts for its budgets' gateway id,
		// "legacy:" + its name (ledger.LegacyGateway).
		return nil
	}
	return withReason(connect.NewError(connect.CodePermissionDenied,
		fmt.Errorf("%s for gateway %q: token %q may act only for gateway %q (its name in the tokens file), or needs the admin role",
			procedure, gatewayID, id.Name, id.Name)), ReasonPermissionDenied)
}
