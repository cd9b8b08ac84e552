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
)

// adminOnly are the procedures the gateway role may not call.
var adminOnly = map[string]bool{
	capledgerv1connect.LedgerServicePublishPolicyProcedure:  true,
	capledgerv1connect.LedgerServiceRollbackPolicyProcedure: true,
	capledgerv1connect.LedgerServiceAuditProcedure:          true,
	// The backlog lists every tenant's reservations.
	capledgerv1connect.LedgerServiceListUsageUnknownProcedure: true,
	capledgerv1connect.LedgerServiceListDebtsProcedure:        true,
}

// Identity is who presented a token.
type Identity struct {
	Name string
	Role Role
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
// gateway or admin; blank lines and lines starting with # are ignored. It
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
		if len(fields) != 3 {
			return nil, fmt.Errorf("line %d: want `token role name`, got %d fields", line, len(fields))
		}
		role := Role(fields[1])
		if role != RoleGateway && role != RoleAdmin {
			return nil, fmt.Errorf("line %d: role %q is neither %q nor %q", line, role, RoleGateway, RoleAdmin)
		}
		if len(fields[0]) < 16 {
			return nil, fmt.Errorf("line %d: token shorter than 16 characters", line)
		}
		digest := sha256.Sum256([]byte(fields[0]))
		if seen[digest] {
			return nil, fmt.Errorf("line %d: token appears twice", line)
		}
		seen[digest] = true
		t.entries = append(t.entries, tokenEntry{digest: digest, id: Identity{Name: fields[2], Role: role}})
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

// authInterceptor checks the bearer token and the role for every call.
// Missing or unknown token: UNAUTHENTICATED (401); a gateway token on an
// admin procedure: PERMISSION_DENIED (403).
func authInterceptor(tokens *Tokens) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			header := req.Header().Get("Authorization")
			token, ok := strings.CutPrefix(header, "Bearer ")
			if !ok || token == "" {
				return nil, withReason(connect.NewError(connect.CodeUnauthenticated,
					errors.New("missing bearer token: send `Authorization: Bearer <token>`")), ReasonUnauthenticated)
			}
			id, ok := tokens.lookup(strings.TrimSpace(token))
			if !ok {
				return nil, withReason(connect.NewError(connect.CodeUnauthenticated, errors.New("unknown token")), ReasonUnauthenticated)
			}
			if adminOnly[req.Spec().Procedure] && id.Role != RoleAdmin {
				return nil, withReason(connect.NewError(connect.CodePermissionDenied,
					fmt.Errorf("%s needs the admin role; token %q has role %s", req.Spec().Procedure, id.Name, id.Role)), ReasonPermissionDenied)
			}
			return next(context.WithValue(ctx, identityKey{}, id), req)
		}
	})
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
	if !ok || id.Role == RoleAdmin || id.Name == gatewayID {
		return nil
	}
	return withReason(connect.NewError(connect.CodePermissionDenied,
		fmt.Errorf("%s for gateway %q: token %q may act only for gateway %q (its name in the tokens file), or needs the admin role",
			procedure, gatewayID, id.Name, id.Name)), ReasonPermissionDenied)
}
