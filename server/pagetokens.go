package server

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"slices"
	"strings"

	"github.com/capledger/capledger/ledger"
)

// Page tokens of scoped callers. A scoped token's list read examines a
// bounded number of stored rows per call (maxScopedScanPages), so a page
// may end on a row outside the scope, or hold none at all, and the next
// token must continue after that row. Its cursor (a reservation id, an
// account key, a policy generation) must not reach the caller, so such tokens are sealed:
// encrypted and authenticated (AES-256-GCM) under a key derived from
// every token of the tokens file (pageSealer), bound to the method and to
// the token itself (its digest; not its name, which two tokens may
// share). Replicas given the same tokens file share the key, and
// it survives restarts; a sealed token from another tokens file is
// refused as not this method's (the caller starts again). Unscoped
// callers' tokens are sealed the same way (sealNext), so that a cursor
// built by hand is refused as one the method did not issue.

// maxScopedScanPages bounds the store pages one scoped list call reads
// (in all at most that many pages of the page size), whatever the scope
// leaves out: a scoped token over a store holding nothing in its scope
// costs a bounded read per call, not the whole backlog, every debtor, or
// every reservation of a subject on the routes a routes= token excludes
// (ListUsageUnknown, ListDebts, ListSubjectReservations), or every
// other tenant's policy (ListPolicies). The engine's
// AccountsInDebt bounds its own pages alike (maxDebtScans).
const maxScopedScanPages = 8

// reservationPage reads one page of at most size reservations for the
// caller (scopedPage, a reservation in the scope when its subject and
// route are: InScope).
func reservationPage[C any](ctx context.Context, size int, read func(limit int, after *C) ([]ledger.Reservation, error), cursorOf func(*ledger.Reservation) C) (rows []ledger.Reservation, next *C, err error) {
	return scopedPage(ctx, size, read, cursorOf, func(r *ledger.Reservation) bool {
		return InScope(ctx, r.Account.Subject, r.Account.Route)
	})
}

// scopedPage reads one page of at most size rows for the caller: read
// returns up to limit rows in the list's order, after the given cursor
// (nil: where the request's token starts), cursorOf is a row's cursor,
// and inScope tells a scoped caller's rows. An unscoped caller gets one
// read of size+1 rows (the one more tells whether there is a next page;
// next follows the last row shown). A scoped caller's rows are those in
// its scope: it reads on past the others for at most maxScopedScanPages
// reads and as many pages of size rows, asking each time for one row
// more than the page still lacks (while the bound allows), so that a
// page filled exactly at the store's end gets no next cursor. next
// follows the last row examined, which may lie outside the scope
// (sealNext seals it), so a short or even empty page with a next cursor
// means "keep paging". next is nil when the store has no more.
func scopedPage[R, C any](ctx context.Context, size int, read func(limit int, after *C) ([]R, error), cursorOf func(*R) C, inScope func(*R) bool) (rows []R, next *C, err error) {
	if !scoped(ctx) {
		if rows, err = read(size+1, nil); err != nil || len(rows) <= size {
			return rows, nil, err
		}
		c := cursorOf(&rows[size-1])
		return rows[:size], &c, nil
	}
	budget := maxScopedScanPages * size // rows this call may still read
	for range maxScopedScanPages {
		if budget == 0 {
			break
		}
		ask := min(size-len(rows)+1, budget)
		page, err := read(ask, next)
		if err != nil {
			return nil, nil, err
		}
		budget -= len(page)
		for i := range page {
			if len(rows) == size {
				return rows, next, nil // page[i] is one more
			}
			c := cursorOf(&page[i])
			next = &c
			if inScope(&page[i]) {
				rows = append(rows, page[i])
			}
		}
		if len(page) < ask {
			return rows, nil, nil // the store has no more
		}
	}
	return rows, next, nil
}

// sealedPrefix starts every sealed token; base64url has no '.', so no
// plain token starts so.
const sealedPrefix = "p1."

// pageSealer seals and opens the page tokens of scoped callers.
type pageSealer struct {
	aead cipher.AEAD
}

// newPageSealer derives the sealing key from the digests of every token
// of the tokens file (sorted, so line order does not matter): a caller
// must hold every token of the file to derive it.
func newPageSealer(t *Tokens) *pageSealer {
	digests := make([][]byte, len(t.entries))
	for i := range t.entries {
		digests[i] = t.entries[i].digest[:]
	}
	slices.SortFunc(digests, bytes.Compare)
	h := sha256.New()
	h.Write([]byte("capledger page tokens v1\x00"))
	for _, d := range digests {
		h.Write(d)
	}
	block, err := aes.NewCipher(h.Sum(nil))
	if err != nil {
		panic(err) // a 32-byte key always makes a cipher
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &pageSealer{aead: aead}
}

// seal returns plain sealed for the calls of method by holder (the digest
// of the token it is issued to).
func (p *pageSealer) seal(method, holder, plain string) string {
	nonce := make([]byte, p.aead.NonceSize())
	rand.Read(nonce) // never fails (crypto/rand)
	sealed := p.aead.Seal(nonce, nonce, []byte(plain), sealedAD(method, holder))
	return sealedPrefix + base64.RawURLEncoding.EncodeToString(sealed)
}

// open returns the plain token sealed in token, or errSealedElsewhere when
// it is not one sealed with this key for holder's calls of method.
func (p *pageSealer) open(method, holder, token string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(token, sealedPrefix))
	if err != nil || len(raw) < p.aead.NonceSize() {
		return "", errSealedElsewhere
	}
	nonce, body := raw[:p.aead.NonceSize()], raw[p.aead.NonceSize():]
	plain, err := p.aead.Open(nil, nonce, body, sealedAD(method, holder))
	if err == nil {
		return string(plain), nil
	}
	return "", errSealedElsewhere
}

func sealedAD(method, holder string) []byte {
	return []byte(method + "\x00" + holder)
}

var errSealedElsewhere = errors.New("not a nextPageToken this server issued for this method and token (sealed tokens are bound to the token they were issued to and to the tokens file): ask for the first page (no pageToken)")

// sealNext returns a list method's next page token for the caller: sealed
// whenever the server has a tokens file (a scoped caller's may follow a
// row outside the scope; an unscoped caller's is sealed too, so that a
// cursor built by hand is refused as one this method did not issue, as
// API.md promises), plain without one (auth off: no key is shared by the
// replicas, and every caller may read every row anyway).
func (s *Server) sealNext(ctx context.Context, method, plain string) string {
	if plain == "" || s.sealer == nil {
		return plain
	}
	id, _ := IdentityFrom(ctx)
	return s.sealer.seal(method, string(id.token[:]), plain)
}

// unsealPage returns the plain token of a list request's page_token: ""
// for none, a sealed one opened for the caller; with a tokens file any
// other is errSealedElsewhere (sealNext seals every token then), without
// one it is returned as it is (the method's parser decides).
func (s *Server) unsealPage(ctx context.Context, method, token string) (string, error) {
	if token == "" {
		return "", nil
	}
	if !strings.HasPrefix(token, sealedPrefix) {
		if s.sealer != nil {
			return "", errSealedElsewhere
		}
		return token, nil
	}
	id, ok := IdentityFrom(ctx)
	if !ok || s.sealer == nil {
		return "", errSealedElsewhere
	}
	return s.sealer.open(method, string(id.token[:]), token)
}
