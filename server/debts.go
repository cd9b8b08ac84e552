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
	after, err := parseDebtToken(req.Msg.GetPageToken())
	if err != nil {
		return nil, invalidArgument(ReasonInvalidCommand, "page_token: %v", err)
	}
	var accounts []ledger.Account
	var next ledger.AccountKey
	var more bool
	if !scoped(ctx) {
		accounts, next, more, err = s.ledger.AccountsInDebt(ctx, store.DebtFilter{After: after, Limit: size})
		if err != nil {
			return nil, readError("list debts", ReasonStoreUnavailable, err)
		}
	} else {
		// A scoped viewer sees its own tenants' debts only, and its page
		// token must not name another's account: read on until size+1
		// accounts in the scope are found (one more than the page tells
		// whether there is a next one) or the store has no more, and
		// follow the last one shown (as ListSubjectReservations).
		filter := store.DebtFilter{After: after, Limit: size + 1}
		for {
			page, pageNext, pageMore, err := s.ledger.AccountsInDebt(ctx, filter)
			if err != nil {
				return nil, readError("list debts", ReasonStoreUnavailable, err)
			}
			for i := range page {
				if InScope(ctx, page[i].Key.Subject, page[i].Key.Route) {
					accounts = append(accounts, page[i])
				}
			}
			if len(accounts) > size || !pageMore {
				break
			}
			filter.After = pageNext
		}
		if len(accounts) > size {
			accounts, more, next = accounts[:size], true, accounts[size-1].Key
		}
	}
	resp := &v1.ListDebtsResponse{}
	if more {
		resp.NextPageToken = debtToken(next)
	}
	for i := range accounts {
		p, err := s.policies.get(ctx, accounts[i].Key.Generation)
		if err != nil {
			return nil, readError("list debts", ReasonPolicyNotFound, err)
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
	return k, nil
}

var errNotDebtToken = errors.New("not a next_page_token of ListDebts")
