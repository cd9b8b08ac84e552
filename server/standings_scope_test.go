package server_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/store"
)

// Two viewers scoped to the same subjects but different routes see
// different accounts, so they never share one ranking: a ranking
// computed for one while the other asks is not the other's answer.
// (A planted break, the shared rankings keyed by the scope's subjects
// alone, passed every other test: the embed-only viewer was answered
// with the chat accounts it may not see.)
func TestConsoleStandingsAreNotSharedAcrossRouteScopes(t *testing.T) {
	const (
		chatViewer  = "viewer-chat-route-0123456789"
		embedViewer = "viewer-embed-route-0123456789"
	)
	tokens := adminToken + " admin ops\n" +
		chatViewer + " viewer chat subjects=tenant-* routes=chat.generate\n" +
		embedViewer + " viewer embed subjects=tenant-* routes=embed.generate\n"
	scans := &gatedScans{release: make(chan struct{})}
	h := newHarness(t, harnessOptions{auth: true, tokens: tokens, wrapStore: func(st store.Store) store.Store {
		scans.Store = st
		return scans
	}})
	consoleTraffic(h) // tenant-a/u1 and tenant-b/u1 on chat.generate
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"embed.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	h.ok("Reserve", `{"reservationId":"e1","subject":"tenant-e/u1","route":"embed.generate","units":{"tokens":10}}`, adminToken)

	var wg sync.WaitGroup
	var chat, embed map[string]any
	wg.Add(2)
	go func() {
		defer wg.Done()
		chat = h.consoleOK("ListAccountStandings", `{"limit":20}`, chatViewer)
	}()
	for scans.count() == 0 {
		time.Sleep(time.Millisecond)
	}
	// The chat viewer's scan is held; the embed viewer asks meanwhile.
	go func() {
		defer wg.Done()
		embed = h.consoleOK("ListAccountStandings", `{"limit":20}`, embedViewer)
	}()
	for deadline := time.Now().Add(3 * time.Second); scans.count() < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(scans.release)
	wg.Wait()

	if num(chat["matched"]) != 2 {
		t.Errorf("chat viewer: matched %v, want its 2 chat accounts", chat["matched"])
	}
	if num(embed["matched"]) != 1 {
		t.Errorf("embed viewer: matched %v, want its 1 embed account", embed["matched"])
	}
	accounts, _ := embed["accounts"].([]any)
	for _, a := range accounts {
		account, _ := a.(map[string]any)["account"].(map[string]any)
		if route := fmt.Sprint(account["route"]); route != "embed.generate" {
			t.Errorf("embed viewer sees an account on route %s: %v", route, a)
		}
	}
	if got := scans.count(); got != 2 {
		t.Errorf("%d scans for two scopes, want one each", got)
	}
}
