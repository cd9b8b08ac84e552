package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// ListDebts implements LedgerService.ListDebts: the accounts frozen by
// debt, for the operator who sees ADMISSION_FROZEN rejections and wants
// to know whose.
func (s *Server) ListDebts(ctx context.Context, req *connect.Request[v1.ListDebtsRequest]) (*connect.Response[v1.ListDebtsResponse], error) {
	size, cerr := pageSize(req.Msg.GetPageSize())
	if cerr != nil {
		return nil, cerr
	}
	plain, err := s.unsealPage(ctx, "ListDebts", req.Msg.GetPageToken())
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	after, err := parseDebtToken(plain)
	if err != nil {
		return nil, invalidField(ReasonInvalidCommand, "pageToken", ": %v", err)
	}
	// A scoped viewer sees its own tenants' debts only. The engine leaves
	// the others out before it reads anything more for them, reads a
	// bounded number of store pages (whatever it leaves out), and the
	// next token follows the last row it examined, which may lie outside
	// the scope: sealNext seals it, so a short or empty page with a token
	// means "keep paging".
	accounts, with, next, more, err := s.ledger.AccountsInDebt(ctx, store.DebtFilter{After: after, Limit: size}, scopeFilter(ctx))
	if err != nil {
		return nil, readError("list debts", ReasonStoreUnavailable, err)
	}
	resp := &v1.ListDebtsResponse{}
	if more {
		resp.NextPageToken = s.sealNext(ctx, "ListDebts", debtToken(next))
	}
	for i := range accounts {
		p, cerr := s.shownPolicy(ctx, with, accounts[i].Key)
		if cerr != nil {
			return nil, cerr
		}
		resp.Accounts = append(resp.Accounts, accountProto(&accounts[i], &p))
	}
	return connect.NewResponse(resp), nil
}

// debtToken encodes an account key as an opaque page token: the key's four
// parts as a JSON array, base64url (subjects and routes may hold any
// character, so no separator would do).
func debtToken(k ledger.AccountKey) string {
	raw, _ := json.Marshal([]any{k.Subject, k.Route, k.Region, k.Generation})
	return base64.RawURLEncoding.EncodeToString(raw)
}

func parseDebtToken(token string) (ledger.AccountKey, error) {
	if token == "" {
		return ledger.AccountKey{}, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return ledger.AccountKey{}, errNotDebtToken
	}
	var parts []json.RawMessage
	var k ledger.AccountKey
	if json.Unmarshal(raw, &parts) != nil || len(parts) != 4 ||
		json.Unmarshal(parts[0], &k.Subject) != nil || json.Unmarshal(parts[1], &k.Route) != nil ||
		json.Unmarshal(parts[2], &k.Region) != nil || json.Unmarshal(parts[3], &k.Generation) != nil || k.Subject == "" ||
		k.Generation > math.MaxInt64 { // no store holds one; it would refuse it as UNAVAILABLE
		return ledger.AccountKey{}, errNotDebtToken
	}
	// Nor does any hold a key part no account key can have (a NUL byte,
	// which PostgreSQL refuses as UNAVAILABLE, or one too long): without
	// a tokens file the cursor is plain JSON a caller can build by hand.
	for _, part := range []string{k.Subject, k.Route, k.Region} {
		if ledger.KeyPartProblem(part) != "" {
			return ledger.AccountKey{}, errNotDebtToken
		}
	}
	return k, nil
}

var errNotDebtToken = errors.New("not a nextPageToken of ListDebts")
