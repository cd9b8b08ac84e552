package server_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// A viewer scoped to tenant-b/* lists only tenant-b's shards (API.md,
// "Scopes": ListShards leaves rows outside the scope out), over a real
// socket with the admin having issued one shard to each tenant; the admin
// lists both. The scope check is the only thing keeping tenant-a's shard
// (its gateway, fence and allocation) from the tenant-b viewer.
func TestScopedListShardsLeavesOtherTenantsOut(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, shards: true})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","emergencyMode":true,
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, adminToken)
	shards := func(method, body, token string) response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+method, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		return h.do(req)
	}
	for _, s := range []struct{ id, subject, gateway string }{
		{"sh-a", "tenant-a/u1", "gw-a"},
		{"sh-b", "tenant-b/u1", "gw-b"},
	} {
		body := fmt.Sprintf(`{"shardId":%q,"subject":%q,"route":"chat.generate","units":{"tokens":5},"gatewayId":%q,"bootEpoch":"1","ttl":"600s"}`,
			s.id, s.subject, s.gateway)
		if r := shards("IssueShard", body, adminToken); r.status != http.StatusOK {
			t.Fatalf("issue %s: %d %s", s.id, r.status, r.raw)
		}
	}
	listed := func(token string) []string {
		t.Helper()
		r := shards("ListShards", `{}`, token)
		if r.status != http.StatusOK {
			t.Fatalf("ListShards: %d %s", r.status, r.raw)
		}
		var ids []string
		for _, s := range asList(r.body["shards"]) {
			ids = append(ids, s.(map[string]any)["shardId"].(string))
		}
		slices.Sort(ids)
		return ids
	}
	if got := listed(adminToken); !slices.Equal(got, []string{"sh-a", "sh-b"}) {
		t.Fatalf("admin lists shards %v, want both", got)
	}
	if got := listed(viewerToken); !slices.Equal(got, []string{"sh-b"}) {
		t.Errorf("a tenant-b viewer lists shards %v, want only tenant-b's [sh-b]", got)
	}
	if r := shards("ListShards", `{}`, viewerToken); strings.Contains(string(r.raw), "tenant-a") || strings.Contains(string(r.raw), "gw-a") {
		t.Errorf("a tenant-b viewer's ListShards names tenant-a's subject or gateway (%d bytes)", len(r.raw))
	}
}

// A viewer scoped to routes=chat.generate reading a subject of its tenant
// that also reserves on embed.batch sees, in ListSubjectReservations, the
// state counts and the retained count of chat.generate only (API.md,
// "Scopes": the rows of routes a routes= token excludes are left out; the
// counts and retained of another route would say how much the tenant does
// there). An unscoped viewer sees both routes'.
func TestRoutesScopedSubjectCountsLeaveOtherRoutesOut(t *testing.T) {
	const routesScoped = "console-routes-token-000000002"
	h := newHarness(t, harnessOptions{auth: true, retention: time.Hour, tokens: consoleTokens +
		routesScoped + " viewer team-b-chat subjects=tenant-b/* routes=chat.generate\n"})
	for _, route := range []string{"chat.generate", "embed.batch"} {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`",
		  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	}
	reserve := func(id, route string) {
		h.ok("Reserve", `{"reservationId":"`+id+`","subject":"tenant-b/u1","route":"`+route+`","units":{"tokens":1}}`, adminToken)
	}
	// Released and retired: 2 on chat.generate, 3 on embed.batch.
	for i, route := range []string{"chat.generate", "chat.generate", "embed.batch", "embed.batch", "embed.batch"} {
		id := fmt.Sprintf("gone-%d", i)
		reserve(id, route)
		h.ok("Release", `{"reservationId":"`+id+`"}`, adminToken)
	}
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Live: one held on each route.
	reserve("chat-live", "chat.generate")
	reserve("embed-live", "embed.batch")

	read := func(token string) (counts map[string]int64, retained int64) {
		t.Helper()
		page := h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1"}`, token)
		counts = map[string]int64{}
		for _, c := range asList(page["counts"]) {
			c := c.(map[string]any)
			counts[c["route"].(string)+"/"+c["state"].(string)] += num(c["count"])
		}
		return counts, num(page["retained"])
	}
	counts, retained := read(consoleViewer)
	if counts["embed.batch/RESERVATION_STATE_RESERVED"] != 1 || counts["chat.generate/RESERVATION_STATE_RESERVED"] != 1 || retained != 5 {
		t.Fatalf("an unscoped viewer sees counts %v retained %d, want a held one per route and 5 retained", counts, retained)
	}
	counts, retained = read(routesScoped)
	want := map[string]int64{"chat.generate/RESERVATION_STATE_RESERVED": 1}
	if len(counts) != len(want) || counts["chat.generate/RESERVATION_STATE_RESERVED"] != 1 {
		t.Errorf("a routes=chat.generate viewer sees counts %v, want %v (embed.batch's left out)", counts, want)
	}
	if retained != 2 {
		t.Errorf("a routes=chat.generate viewer sees retained %d, want 2 (chat.generate's only, not embed.batch's 3)", retained)
	}
}

// asList is a JSON array field, nil when absent (protojson leaves out an
// empty list).
func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
