package ledger_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The stable hash must never change: these vectors were computed
// independently (FNV-1a 64 over each part plus a zero byte, modulo 10000,
// in a few lines of Python), so a change of RolloutBucket that moves a
// route or a subject between shadow and enforcement fails here.
func TestRolloutBucketFixedVectors(t *testing.T) {
	for _, tc := range []struct {
		parts []string
		want  ledger.BasisPoints
	}{
		{[]string{"chat.generate", "global"}, 7309},
		{[]string{"embed.create", "global"}, 5097},
		{[]string{"chat.generate", "global", "tenant-7"}, 8287},
		{[]string{"a", "b"}, 358},
		{[]string{""}, 7455},
		{[]string{"ab"}, 398}, // "ab" is not "a","b": the separator counts
		{[]string{"a", "b", "c"}, 1853},
	} {
		if got := ledger.RolloutBucket(tc.parts...); got != tc.want {
			t.Errorf("RolloutBucket(%q) = %d, want %d", tc.parts, got, tc.want)
		}
	}
}

func routes(names ...string) []ledger.RouteKey {
	out := make([]ledger.RouteKey, len(names))
	for i, n := range names {
		out[i] = ledger.RouteKey{Route: n}
	}
	return out
}

// Route hashing enforces ceil(share × n) routes, at least one above 0%,
// chosen by bucket order, and growing the share only adds routes.
func TestRolloutByRouteSteps(t *testing.T) {
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("route-%02d", i))
	}
	r, err := ledger.NewRollout("all", ledger.RolloutByRoute, routes(names...), nil, "ops", t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.EnforcedRoutes(); len(got) != 0 {
		t.Fatalf("at 0%% enforced %v", got)
	}
	var previous []ledger.RouteKey
	for _, step := range []struct {
		share ledger.BasisPoints
		want  int
	}{{100, 1}, {500, 2}, {2500, 10}, {10000, 40}} {
		changed, err := r.SetShare(step.share, "ops", t0)
		if err != nil || !changed {
			t.Fatalf("SetShare(%s) = %v, %v", step.share, changed, err)
		}
		got := r.EnforcedRoutes()
		if len(got) != step.want {
			t.Fatalf("at %s: %d routes enforced, want %d", step.share, len(got), step.want)
		}
		for _, rk := range previous {
			if !slices.Contains(got, rk) {
				t.Errorf("at %s: %s, enforced before, is not any more", step.share, rk)
			}
		}
		for _, rk := range r.Routes {
			mode, ok := r.Mode(rk, "any-subject")
			if want := map[bool]ledger.RolloutMode{true: ledger.RolloutEnforce, false: ledger.RolloutShadow}[slices.Contains(got, rk)]; !ok || mode != want {
				t.Errorf("at %s: Mode(%s) = %s, %v; want %s", step.share, rk, mode, ok, want)
			}
		}
		previous = got
	}
	// The 1% route is the one with the lowest bucket.
	lowest := r.Routes[0]
	for _, rk := range r.Routes {
		if ledger.RolloutBucket(rk.Route, rk.Region) < ledger.RolloutBucket(lowest.Route, lowest.Region) {
			lowest = rk
		}
	}
	r.Share = 100
	if got := r.EnforcedRoutes(); len(got) != 1 || got[0] != lowest {
		t.Errorf("at 1%% enforced %v, want the lowest bucket %s", got, lowest)
	}
}

// Subject hashing enforces the subjects whose bucket is below the share,
// on every route of the rollout, and about that share of them.
func TestRolloutBySubjectShare(t *testing.T) {
	r, err := ledger.NewRollout("chat", ledger.RolloutBySubject, routes("chat.generate"), nil, "ops", t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.SetShare(2500, "ops", t0); err != nil {
		t.Fatal(err)
	}
	idx := ledger.NewRollouts([]ledger.Rollout{r})
	route := ledger.RouteKey{Route: "chat.generate", Region: ledger.DefaultRegion}
	enforced := 0
	for i := range 4000 {
		subject := fmt.Sprintf("tenant-%d", i)
		mode, name := ledger.RolloutModeFor(idx, route, subject, ledger.RolloutShadow)
		want := ledger.RolloutShadow
		if ledger.RolloutBucket(route.Route, route.Region, subject) < 2500 {
			want = ledger.RolloutEnforce
			enforced++
		}
		if mode != want || name != "chat" {
			t.Fatalf("%s: %s in %q, want %s", subject, mode, name, want)
		}
	}
	if enforced < 800 || enforced > 1200 {
		t.Errorf("%d of 4000 subjects enforced at 25%%", enforced)
	}
	// tenant-7 is in bucket 8287: shadow below 82.87%, enforced above.
	for _, tc := range []struct {
		share ledger.BasisPoints
		want  ledger.RolloutMode
	}{{8287, ledger.RolloutShadow}, {8288, ledger.RolloutEnforce}, {0, ledger.RolloutShadow}, {10000, ledger.RolloutEnforce}} {
		r.Share = tc.share
		if got, _ := ledger.RolloutModeFor(ledger.NewRollouts([]ledger.Rollout{r}), route, "tenant-7", ledger.RolloutEnforce); got != tc.want {
			t.Errorf("tenant-7 at %s: %s, want %s", tc.share, got, tc.want)
		}
	}
	// A route outside every rollout keeps its policy's mode.
	for _, m := range []ledger.RolloutMode{ledger.RolloutShadow, ledger.RolloutEnforce} {
		if got, name := ledger.RolloutModeFor(idx, ledger.RouteKey{Route: "embed.create", Region: "global"}, "tenant-7", m); got != m || name != "" {
			t.Errorf("outside the rollout: %s in %q, want the policy's %s", got, name, m)
		}
	}
}

// A policy's mode now is the one its reserves get: its own off every
// rollout, the rollout's on a rollout's route, and none for a "*" policy
// whose route a rollout hashes by subject between 0 and 100%.
func TestPolicyModeNow(t *testing.T) {
	r, err := ledger.NewRollout("chat", ledger.RolloutBySubject, routes("chat.generate"), nil, "ops", t0)
	if err != nil {
		t.Fatal(err)
	}
	policy := func(subject, route string, own ledger.RolloutMode) *ledger.Policy {
		return &ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: route, Region: ledger.DefaultRegion}, Rollout: own}
	}
	for _, tc := range []struct {
		share  ledger.BasisPoints
		by     ledger.RolloutHash
		policy *ledger.Policy
		want   ledger.RolloutMode
		one    bool
	}{
		{2500, ledger.RolloutBySubject, policy("tenant-7", "embed.create", ledger.RolloutShadow), ledger.RolloutShadow, true},
		{2500, ledger.RolloutBySubject, policy("tenant-7", "chat.generate", ledger.RolloutEnforce), ledger.RolloutShadow, true}, // bucket 8287
		{8288, ledger.RolloutBySubject, policy("tenant-7", "chat.generate", ledger.RolloutShadow), ledger.RolloutEnforce, true},
		{2500, ledger.RolloutBySubject, policy(ledger.AnySubject, "chat.generate", ledger.RolloutEnforce), "", false},
		{0, ledger.RolloutBySubject, policy(ledger.AnySubject, "chat.generate", ledger.RolloutEnforce), ledger.RolloutShadow, true},
		{10000, ledger.RolloutBySubject, policy(ledger.AnySubject, "chat.generate", ledger.RolloutShadow), ledger.RolloutEnforce, true},
		{10000, ledger.RolloutByRoute, policy(ledger.AnySubject, "chat.generate", ledger.RolloutShadow), ledger.RolloutEnforce, true},
		{0, ledger.RolloutByRoute, policy(ledger.AnySubject, "chat.generate", ledger.RolloutEnforce), ledger.RolloutShadow, true},
		// The rollout covers chat.generate in the default region alone:
		// the route in another region keeps its policy's own mode.
		{2500, ledger.RolloutBySubject, &ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"}, Rollout: ledger.RolloutEnforce}, ledger.RolloutEnforce, true},
	} {
		r.Share, r.By = tc.share, tc.by
		got, one := ledger.PolicyModeNow(ledger.NewRollouts([]ledger.Rollout{r}), tc.policy)
		if got != tc.want || one != tc.one {
			t.Errorf("%s %s at %s by %s: %q %v, want %q %v", tc.policy.Key, tc.policy.Rollout, tc.share, tc.by, got, one, tc.want, tc.one)
		}
	}
}

// Steps and undo: each step is recorded with who and when; undo walks
// back one standing step at a time; a repeated step records nothing.
func TestRolloutStepAndUndo(t *testing.T) {
	r, err := ledger.NewRollout("chat", ledger.RolloutByRoute, routes("b", "a"), nil, "ops", t0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Routes[0].Route != "a" || r.Routes[0].Region != ledger.DefaultRegion {
		t.Fatalf("routes %v: not sorted or region not defaulted", r.Routes)
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Minute) }
	for i, share := range []ledger.BasisPoints{100, 500, 500, 2500} {
		changed, err := r.SetShare(share, fmt.Sprintf("op-%d", i), at(i))
		if err != nil {
			t.Fatal(err)
		}
		if changed == (i == 2) {
			t.Errorf("step %d to %s: changed %v", i, share, changed)
		}
	}
	if r.Share != 2500 || r.Version != 4 || len(r.Steps) != 4 {
		t.Fatalf("after steps: share %s version %d steps %d", r.Share, r.Version, len(r.Steps))
	}
	undone, err := r.Undo("op-undo", at(10))
	if err != nil || undone.Share != 2500 || r.Share != 500 {
		t.Fatalf("undo: %+v, %v; share %s", undone, err, r.Share)
	}
	undone, err = r.Undo("op-undo", at(11))
	if err != nil || undone.Share != 500 || r.Share != 100 {
		t.Fatalf("second undo: %+v, %v; share %s", undone, err, r.Share)
	}
	last := r.Steps[len(r.Steps)-1]
	if last.Action != ledger.RolloutUndo || last.Who != "op-undo" || !last.At.Equal(at(11)) || last.Undoes != 3 || last.Prior != 500 || last.Share != 100 {
		t.Errorf("undo step recorded as %+v", last)
	}
	if r.Steps[2].UndoneBy != last.Seq {
		t.Errorf("the undone step says UndoneBy %d, want %d", r.Steps[2].UndoneBy, last.Seq)
	}
	if _, err := r.Undo("x", at(12)); err != nil || r.Share != 0 {
		t.Fatalf("third undo: %v, share %s", err, r.Share)
	}
	if _, err := r.Undo("x", at(13)); !errors.Is(err, ledger.ErrNothingToUndo) {
		t.Errorf("undo past the first step: %v", err)
	}
	var fe *ledger.FieldError
	if _, err := r.SetShare(10001, "x", at(14)); !errors.Is(err, ledger.ErrInvalidRollout) || !errors.As(err, &fe) || fe.Path != "percent" {
		t.Errorf("share above 100%%: %v, want ErrInvalidRollout naming the field percent", err)
	}
}

// A new rollout's name is a word an operator types and reads back: ASCII
// letters, digits, '.', '_' and '-', 1 to 128 bytes (ledger.NameProblem);
// anything else is ErrInvalidRollout naming the field "name", while
// RolloutNameProblem, the rule a stored rollout's name is read by, still
// takes such a name.
func TestNewRolloutNameIsAWord(t *testing.T) {
	for _, good := range []string{"chat", "q3-enforce", "llm_2026.12", "A", strings.Repeat("n", ledger.MaxRolloutNameBytes)} {
		if _, err := ledger.NewRollout(good, ledger.RolloutByRoute, routes("x"), nil, "ops", t0); err != nil {
			t.Errorf("NewRollout(%q): %v", good, err)
		}
	}
	for _, tc := range []struct{ name, problem string }{
		{"", "is empty"},
		{"bad name!", "holds ' ' at byte 3: use only ASCII letters, digits, '.', '_' and '-'"},
		{"bad!", "holds '!' at byte 3: use only ASCII letters, digits, '.', '_' and '-'"},
		{"a/b", "holds '/' at byte 1: use only ASCII letters, digits, '.', '_' and '-'"},
		{"two\nlines", `holds '\n' at byte 3: use only ASCII letters, digits, '.', '_' and '-'`},
		{"café", "holds 'é' at byte 3: use only ASCII letters, digits, '.', '_' and '-'"},
		{strings.Repeat("n", ledger.MaxRolloutNameBytes+1), "is 129 bytes long; at most 128"},
		{"a\xffb", "is not valid UTF-8"},
		{"a\x00b", "contains a NUL byte"},
	} {
		_, err := ledger.NewRollout(tc.name, ledger.RolloutByRoute, routes("x"), nil, "ops", t0)
		var fe *ledger.FieldError
		if !errors.Is(err, ledger.ErrInvalidRollout) || !errors.As(err, &fe) || fe.Path != "name" || fe.Problem != tc.problem {
			t.Errorf("NewRollout(%q) = %v, want ErrInvalidRollout: name %s", tc.name, err, tc.problem)
		}
		if problem := ledger.NameProblem(tc.name, ledger.MaxRolloutNameBytes); problem == "" {
			t.Errorf("NameProblem(%q) takes it", tc.name)
		}
	}
	if problem := ledger.RolloutNameProblem("bad name!"); problem != "" {
		t.Errorf("RolloutNameProblem(%q) = %q: a rollout stored under it could no longer be named", "bad name!", problem)
	}
}

func TestNewRolloutRefuses(t *testing.T) {
	existing, _ := ledger.NewRollout("chat", ledger.RolloutByRoute, routes("chat.generate"), nil, "ops", t0)
	for _, tc := range []struct {
		name   string
		by     ledger.RolloutHash
		routes []ledger.RouteKey
		want   error
	}{
		{"", ledger.RolloutByRoute, routes("x"), ledger.ErrInvalidRollout},
		{"n", "tenant", routes("x"), ledger.ErrInvalidRollout},
		{"n", ledger.RolloutByRoute, nil, ledger.ErrInvalidRollout},
		{"n", ledger.RolloutByRoute, routes("x", "x"), ledger.ErrInvalidRollout},
		{"n", ledger.RolloutByRoute, routes(""), ledger.ErrInvalidRollout},
		{"n", ledger.RolloutByRoute, routes("*"), ledger.ErrInvalidRollout},
		{"n", ledger.RolloutByRoute, []ledger.RouteKey{{Route: "x", Region: "*"}}, ledger.ErrInvalidRollout},
		{"chat", ledger.RolloutByRoute, routes("x"), ledger.ErrRolloutExists},
		{"n", ledger.RolloutBySubject, routes("x", "chat.generate"), ledger.ErrRouteInRollout},
	} {
		if _, err := ledger.NewRollout(tc.name, tc.by, tc.routes, []ledger.Rollout{existing}, "ops", t0); !errors.Is(err, tc.want) {
			t.Errorf("NewRollout(%q, %q, %v) = %v, want %v", tc.name, tc.by, tc.routes, err, tc.want)
		}
	}
}

// An ended rollout decides nothing (its routes take the policy's mode),
// frees its routes for another rollout but keeps its name, takes no more
// steps, and ends once: a repeated End records nothing.
func TestRolloutEnd(t *testing.T) {
	r, err := ledger.NewRollout("chat", ledger.RolloutByRoute, routes("chat.generate"), nil, "ops", t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.SetShare(ledger.FullShare, "ops", t0); err != nil {
		t.Fatal(err)
	}
	key := r.Routes[0]
	if mode, name := ledger.RolloutModeFor(ledger.NewRollouts([]ledger.Rollout{r}), key, "t", ledger.RolloutShadow); mode != ledger.RolloutEnforce || name != "chat" {
		t.Fatalf("before the end: %s %q", mode, name)
	}
	if !r.End("ops", t0.Add(time.Minute)) || !r.Ended() || r.Version != 3 || r.Share != ledger.FullShare {
		t.Fatalf("end: ended %v, version %d, share %s", r.Ended(), r.Version, r.Share)
	}
	if r.End("ops", t0.Add(2*time.Minute)) || r.Version != 3 {
		t.Errorf("a second end recorded a step: version %d", r.Version)
	}
	if mode, name := ledger.RolloutModeFor(ledger.NewRollouts([]ledger.Rollout{r}), key, "t", ledger.RolloutShadow); mode != ledger.RolloutShadow || name != "" {
		t.Errorf("an ended rollout still decides: %s %q", mode, name)
	}
	if _, err := r.SetShare(0, "ops", t0); !errors.Is(err, ledger.ErrRolloutEnded) {
		t.Errorf("a step of an ended rollout: %v", err)
	}
	if _, err := r.Undo("ops", t0); !errors.Is(err, ledger.ErrRolloutEnded) {
		t.Errorf("an undo of an ended rollout: %v", err)
	}
	if _, err := ledger.NewRollout("next", ledger.RolloutByRoute, routes("chat.generate"), []ledger.Rollout{r}, "ops", t0); err != nil {
		t.Errorf("a rollout over an ended one's route: %v", err)
	}
	if _, err := ledger.NewRollout("chat", ledger.RolloutByRoute, routes("x"), []ledger.Rollout{r}, "ops", t0); !errors.Is(err, ledger.ErrRolloutExists) {
		t.Errorf("an ended rollout's name reused: %v", err)
	}
}

// The reserve honours the mode the rollout decided over the policy's own:
// an enforced request of a shadow policy is rejected, a shadowed request
// of an enforce policy is answered as a shadow rejection.
func TestReserveRolloutOverride(t *testing.T) {
	m := ledger.NewMemory()
	p := tokensPolicy(1000)
	p.Rollout = ledger.RolloutShadow
	if res := ledger.Apply(m, &ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}, t0); res.Err != nil {
		t.Fatal(res.Err)
	}
	reserve := func(id string, mode ledger.RolloutMode) ledger.Result {
		return ledger.Apply(m, &ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: id,
			Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{600}, Rollout: mode}, t0)
	}
	if res := reserve("r1", ""); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := reserve("r2", ""); !res.Shadow || !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Errorf("policy's shadow mode: %+v", res)
	}
	if res := reserve("r3", ledger.RolloutEnforce); res.Shadow || !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Errorf("rollout enforce over a shadow policy: shadow %v err %v", res.Shadow, res.Err)
	}
	if res := reserve("r4", ledger.RolloutShadow); !res.Shadow {
		t.Errorf("rollout shadow: %+v", res)
	}
	if res := reserve("r5", "sometimes"); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Errorf("unknown mode: %v", res.Err)
	}
	mustAudit(t, m)
}
