package server_test

import (
	"slices"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// GetFairness with a route reads that route's accounts from the store
// (its range of the route index), not every account filtered: among
// 1,144 accounts (two pages of every account), the embed route's answer
// reads its 3 accounts only and chat.generate's none of embed's; both
// answer as a computation over every account does.
func TestConsoleFairnessOfOneRouteReadsItsAccountsOnly(t *testing.T) {
	rows := &pageRows{}
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		rows.Store = st
		return rows
	}})
	fairnessTraffic(h)
	reserveSimilarSubjects(h)
	want := bruteFairness(t, h.store)

	rows.take()
	checkFairness(t, h.consoleOK("GetFairness", `{"route":"embed","limit":1000}`, consoleViewer),
		map[string]*bruteGroup{"embed@global/tokens": want["embed@global/tokens"]}, 1000)
	read := rows.take()
	wantRead := []ledger.AccountKey{}
	for i := range 3 {
		wantRead = append(wantRead, ledger.AccountKey{Subject: "e-0" + string(rune('0'+i)), Route: "embed", Region: "global", Generation: 2})
	}
	if !slices.Equal(read, wantRead) {
		t.Errorf("route embed: read %d accounts (%v ...); want %v", len(read), read[:min(len(read), 3)], wantRead)
	}

	checkFairness(t, h.consoleOK("GetFairness", `{"route":"chat.generate","limit":1000}`, consoleViewer),
		map[string]*bruteGroup{"chat.generate@global/tokens": want["chat.generate@global/tokens"]}, 1000)
	read = rows.take()
	for _, k := range read {
		if k.Route != "chat.generate" {
			t.Fatalf("route chat.generate: read %s", k)
		}
	}
	if len(read) < 30+len(similarSubjects()) {
		t.Errorf("route chat.generate: read %d accounts; want its %d at least", len(read), 30+len(similarSubjects()))
	}
}
