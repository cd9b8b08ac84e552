package ledger

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"
)

// A rollout moves a set of routes from shadow mode to enforcement in
// steps (1%, 5%, 25%, 100%). Which requests a step enforces is one rule,
// RolloutModeFor, used by the server for every reserve (it puts the
// answer in Command.Rollout) and by the views that list what is enforced;
// nothing else restates it. The rollout's state (its routes, how it hashes,
// its current share and every step with who took it and when) is a row of
// the store's rollout table, so the ledger, not an operator's file, knows
// which routes are enforced.

// RolloutHash says what a rollout's stable hash selects.
type RolloutHash string

const (
	// RolloutByRoute enforces a share of the rollout's routes: the routes
	// are ordered by their stable hash (RolloutBucket of route and region)
	// and a step at share s enforces the first ceil(s × n) of the n routes,
	// at least one for any share above zero. Every request of an enforced
	// route is enforced; growing the share only adds routes.
	RolloutByRoute RolloutHash = "route"
	// RolloutBySubject enforces a share of the subjects (tenants) on every
	// route of the rollout: a request is enforced when the bucket of its
	// route, region and subject is below the share. Subjects are not
	// enumerable, so the share is a threshold, not a count; growing it only
	// adds subjects.
	RolloutBySubject RolloutHash = "subject"
)

// BasisPoints is a share in hundredths of a percent: 10000 is 100%.
type BasisPoints uint32

// FullShare is 100%.
const FullShare BasisPoints = 10000

func (s BasisPoints) String() string {
	if s%100 == 0 {
		return fmt.Sprintf("%d%%", s/100)
	}
	return fmt.Sprintf("%d.%02d%%", s/100, s%100)
}

// RouteKey names one route in one region.
type RouteKey struct {
	Route  string
	Region string
}

func (k RouteKey) String() string { return k.Route + "@" + k.Region }

// Compare orders route keys by route, then region.
func (k RouteKey) Compare(o RouteKey) int {
	return cmp.Or(cmp.Compare(k.Route, o.Route), cmp.Compare(k.Region, o.Region))
}

// RolloutAction names a step of a rollout's history.
type RolloutAction string

const (
	RolloutCreated RolloutAction = "create"
	RolloutSet     RolloutAction = "set"
	RolloutUndo    RolloutAction = "undo"
	// RolloutEnd ends the rollout: it decides nothing any more and its
	// routes are free (Rollout.End). It is the last step.
	RolloutEnd RolloutAction = "end"
)

// RolloutStep is one entry of a rollout's audit history: who did what,
// when, and the share before and after.
type RolloutStep struct {
	// Seq numbers the steps from 1.
	Seq    int
	Action RolloutAction
	// Share is the enforced share after the step, Prior before it.
	Share, Prior BasisPoints
	// Who is the token identity (its name in the tokens file) that took
	// the step; "" when the server runs without auth.
	Who string
	At  time.Time
	// Undoes is the Seq of the set step an undo reverted; UndoneBy the
	// Seq of the undo that reverted a set step (0 while it stands).
	Undoes, UndoneBy int
}

// Rollout is one route set's rollout.
type Rollout struct {
	Name string
	By   RolloutHash
	// Routes are the routes of the set, sorted, each in at most one
	// rollout.
	Routes []RouteKey
	// Share is the share enforced now.
	Share BasisPoints
	// Version is 1 once created and grows by one with every step; the
	// store writes a rollout only over the version it replaces.
	Version uint64
	// Steps is the history, oldest first (the create is step 1).
	Steps []RolloutStep
}

// Expected outcomes of rollout changes.
var (
	ErrInvalidRollout  = errors.New("invalid rollout")
	ErrRolloutNotFound = errors.New("rollout not found")
	ErrRolloutExists   = errors.New("rollout already exists")
	// ErrRouteInRollout: a route may belong to one rollout only, or two
	// rollouts would decide the same request.
	ErrRouteInRollout = errors.New("route already belongs to another rollout")
	ErrNothingToUndo  = errors.New("no rollout step left to undo")
	// ErrRolloutEnded: a step of a rollout that ended (Rollout.End).
	ErrRolloutEnded = errors.New("rollout ended: it takes no more steps (create another for its routes)")
)

// MaxRolloutNameBytes bounds a rollout's name.
const MaxRolloutNameBytes = 128

// RolloutNameProblem says what is wrong with a rollout's name (empty, or
// by TextProblem with at most MaxRolloutNameBytes: over 128 bytes, holding
// a NUL byte, not UTF-8), as a phrase that follows the field's path
// ("is empty"); "" for a good one. A call naming a rollout checks it
// before any read. It is the rule for a name a rollout may have been
// stored under; a new rollout's name is held to NameProblem as well
// (NewRolloutNameProblem), so a rollout created before that rule, named
// "bad name!", is still read, stepped and ended by its name.
func RolloutNameProblem(name string) string {
	if name == "" {
		return "is empty"
	}
	return TextProblem(name, MaxRolloutNameBytes)
}

// NewRolloutNameProblem says what is wrong with the name of a rollout
// being created (RolloutNameProblem, then NameProblem with at most
// MaxRolloutNameBytes: only letters, digits, '.', '_' and '-'), as a
// phrase that follows the field's path; "" for a good one. An operator
// types the name on command lines (rollout set NAME) and reads it in
// tables and logs, where a space, a quote or a line end would split it.
func NewRolloutNameProblem(name string) string {
	if problem := RolloutNameProblem(name); problem != "" {
		return problem
	}
	return NameProblem(name, MaxRolloutNameBytes)
}

// MaxRolloutRoutes bounds the routes of one rollout.
const MaxRolloutRoutes = 10000

// NewRollout returns a rollout of routes (region "" means DefaultRegion)
// at share 0 (every route in shadow mode), created by who at now, or
// ErrInvalidRollout for a name NewRolloutNameProblem refuses, an unknown
// hash, no routes, an empty or duplicate route. others are the existing rollouts: a route
// already in one of them is ErrRouteInRollout, a name taken
// ErrRolloutExists.
func NewRollout(name string, by RolloutHash, routes []RouteKey, others []Rollout, who string, now time.Time) (Rollout, error) {
	if problem := NewRolloutNameProblem(name); problem != "" {
		return Rollout{}, NewFieldError(ErrInvalidRollout, "name", problem)
	}
	switch {
	case by != RolloutByRoute && by != RolloutBySubject:
		return Rollout{}, NewFieldError(ErrInvalidRollout, "hashBy", fmt.Sprintf("%q is neither %q nor %q", by, RolloutByRoute, RolloutBySubject))
	case len(routes) == 0:
		return Rollout{}, NewFieldError(ErrInvalidRollout, "routes", ": none given (a rollout covers at least one route)")
	case len(routes) > MaxRolloutRoutes:
		return Rollout{}, NewFieldError(ErrInvalidRollout, "routes", fmt.Sprintf(": %d given; at most %d", len(routes), MaxRolloutRoutes))
	}
	set := make([]RouteKey, len(routes))
	seen := make(map[RouteKey]int, len(routes))
	for i, rk := range routes {
		if rk.Route == "" {
			return Rollout{}, NewFieldError(ErrInvalidRollout, FieldPath(ItemPath("routes", i), "route"), "is empty")
		}
		if rk.Region == "" {
			rk.Region = DefaultRegion
		}
		if field, problem := KeyFieldProblem("", rk.Route, rk.Region); problem != "" {
			return Rollout{}, NewFieldError(ErrInvalidRollout, FieldPath(ItemPath("routes", i), field), problem+" (no policy's can)")
		}
		if field, problem := RouteKeyProblem(rk.Route, rk.Region); problem != "" {
			return Rollout{}, NewFieldError(ErrInvalidRollout, FieldPath(ItemPath("routes", i), field), problem)
		}
		if first, twice := seen[rk]; twice {
			return Rollout{}, NewFieldError(ErrInvalidRollout, ItemPath("routes", i), fmt.Sprintf("%s appears twice", rk)).Twice(ItemPath("routes", first))
		}
		seen[rk] = i
		set[i] = rk
	}
	slices.SortFunc(set, RouteKey.Compare)
	for i := range others {
		if others[i].Name == name {
			return Rollout{}, fmt.Errorf("%w: %s", ErrRolloutExists, name)
		}
		if others[i].Ended() {
			continue // its routes are free
		}
		for _, rk := range set {
			if others[i].Covers(rk) {
				return Rollout{}, fmt.Errorf("%w: %s is in rollout %s", ErrRouteInRollout, rk, others[i].Name)
			}
		}
	}
	return Rollout{Name: name, By: by, Routes: set, Version: 1,
		Steps: []RolloutStep{{Seq: 1, Action: RolloutCreated, Who: who, At: now}}}, nil
}

// Covers reports whether route belongs to the rollout.
func (r *Rollout) Covers(route RouteKey) bool {
	_, found := slices.BinarySearchFunc(r.Routes, route, RouteKey.Compare)
	return found
}

// SetShare takes a step to share, by who at now. It returns false (and
// changes nothing) when the rollout is at share already, so a retried
// step records nothing twice; ErrInvalidRollout for a share above 100%,
// naming the request's field "percent" (a FieldError).
func (r *Rollout) SetShare(share BasisPoints, who string, now time.Time) (bool, error) {
	if r.Ended() {
		return false, ErrRolloutEnded
	}
	if share > FullShare {
		return false, NewFieldError(ErrInvalidRollout, "percent", fmt.Sprintf("%s is above 100%%", share))
	}
	if share == r.Share {
		return false, nil
	}
	r.appendStep(RolloutStep{Action: RolloutSet, Share: share, Prior: r.Share, Who: who, At: now})
	r.Share = share
	return true, nil
}

// Undo reverts the newest set step that stands (was not undone): the
// share goes back to what it was before that step. It returns the step
// undone, or ErrNothingToUndo when every set step was undone already.
func (r *Rollout) Undo(who string, now time.Time) (RolloutStep, error) {
	if r.Ended() {
		return RolloutStep{}, ErrRolloutEnded
	}
	for i := len(r.Steps) - 1; i >= 0; i-- {
		s := &r.Steps[i]
		if s.Action != RolloutSet || s.UndoneBy != 0 {
			continue
		}
		undone := *s
		s.UndoneBy = len(r.Steps) + 1
		r.appendStep(RolloutStep{Action: RolloutUndo, Share: undone.Prior, Prior: r.Share, Who: who, At: now, Undoes: undone.Seq})
		r.Share = undone.Prior
		return undone, nil
	}
	return RolloutStep{}, ErrNothingToUndo // the caller names the rollout
}

// End ends the rollout, by who at now: from then on it decides no
// request (NewRollouts leaves it out, so its routes follow their
// policies' modes) and another rollout may take its routes; it keeps its
// name and history. It returns false (and changes nothing) when the
// rollout had ended already, so a retried end records nothing twice.
// The share is left as it stood, for the history.
func (r *Rollout) End(who string, now time.Time) bool {
	if r.Ended() {
		return false
	}
	r.appendStep(RolloutStep{Action: RolloutEnd, Share: r.Share, Prior: r.Share, Who: who, At: now})
	return true
}

// Ended reports whether End ended the rollout.
func (r *Rollout) Ended() bool {
	return len(r.Steps) > 0 && r.Steps[len(r.Steps)-1].Action == RolloutEnd
}

func (r *Rollout) appendStep(s RolloutStep) {
	s.Seq = len(r.Steps) + 1
	r.Steps = append(r.Steps, s)
	r.Version++
}

// RolloutBucket is the stable hash of a rollout: FNV-1a (64 bits) over the
// parts, each followed by a zero byte, reduced to a bucket in [0, 10000).
// It must never change between versions, or a step would move routes and
// subjects between shadow and enforcement by itself on an upgrade; the
// table test in rollout_test.go pins it.
func RolloutBucket(parts ...string) BasisPoints {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return BasisPoints(h.Sum64() % uint64(FullShare))
}

// EnforcedRoutes returns the routes the rollout enforces at its share:
// under RolloutByRoute the first ceil(share × n) routes in the order of
// their bucket (then key); under RolloutBySubject every route while the
// share is above zero (each enforces the share of its subjects).
func (r *Rollout) EnforcedRoutes() []RouteKey {
	if r.Share == 0 {
		return nil
	}
	if r.By == RolloutBySubject {
		return slices.Clone(r.Routes)
	}
	n := (len(r.Routes)*int(r.Share) + int(FullShare) - 1) / int(FullShare)
	ranked := slices.Clone(r.Routes)
	slices.SortFunc(ranked, func(a, b RouteKey) int {
		return cmp.Or(cmp.Compare(RolloutBucket(a.Route, a.Region), RolloutBucket(b.Route, b.Region)), a.Compare(b))
	})
	enforced := ranked[:n]
	slices.SortFunc(enforced, RouteKey.Compare)
	return enforced
}

// Mode returns the mode of a request of subject on route under the
// rollout alone (RolloutModeFor over it), and false when the rollout does
// not decide it: the route is not the rollout's, or the rollout ended.
func (r *Rollout) Mode(route RouteKey, subject string) (RolloutMode, bool) {
	mode, name := RolloutModeFor(NewRollouts([]Rollout{*r}), route, subject, "")
	return mode, name != ""
}

// Rollouts indexes rollouts by route for RolloutModeFor. Build it once per
// change of the rollouts (NewRollouts), not per request.
type Rollouts struct {
	byRoute map[RouteKey]routeRollout
}

type routeRollout struct {
	rollout *Rollout
	// enforced is the route's mode under RolloutByRoute, precomputed.
	enforced bool
}

// NewRollouts indexes list (each route in at most one rollout that has
// not ended, as NewRollout ensures; a later duplicate is ignored). An
// ended rollout decides nothing: it is left out.
func NewRollouts(list []Rollout) Rollouts {
	idx := Rollouts{byRoute: map[RouteKey]routeRollout{}}
	for i := range list {
		r := &list[i]
		if r.Ended() {
			continue
		}
		enforced := map[RouteKey]bool{}
		if r.By == RolloutByRoute {
			for _, rk := range r.EnforcedRoutes() {
				enforced[rk] = true
			}
		}
		for _, rk := range r.Routes {
			if _, taken := idx.byRoute[rk]; !taken {
				idx.byRoute[rk] = routeRollout{rollout: r, enforced: enforced[rk]}
			}
		}
	}
	return idx
}

// RolloutModeFor is the one rule for whether a reserve is enforced or
// shadowed: a route that belongs to a rollout is decided by the rollout
// (Rollout.Mode: its share, hashed by route or by subject); any other
// route by the mode of the policy that decides (policyMode). It also
// returns the rollout's name ("" for none).
func RolloutModeFor(idx Rollouts, route RouteKey, subject string, policyMode RolloutMode) (RolloutMode, string) {
	rr, ok := idx.byRoute[route]
	if !ok {
		return policyMode, ""
	}
	r := rr.rollout
	switch {
	case r.Share == 0:
		return RolloutShadow, r.Name
	case r.By == RolloutBySubject:
		if RolloutBucket(route.Route, route.Region, subject) < r.Share {
			return RolloutEnforce, r.Name
		}
		return RolloutShadow, r.Name
	case rr.enforced:
		return RolloutEnforce, r.Name
	}
	return RolloutShadow, r.Name
}

// PolicyModeNow is the mode the reserves decided by policy p get now
// (RolloutModeFor for p's subject), and false when they have no one mode:
// p is a "*" policy on a route that a rollout hashes by subject at a share
// strictly between 0 and 100%, where each subject's mode is its own.
func PolicyModeNow(idx Rollouts, p *Policy) (RolloutMode, bool) {
	route := RouteKey{Route: p.Key.Route, Region: p.Key.Region}
	if rr, ok := idx.byRoute[route]; ok && p.Key.Subject == AnySubject &&
		rr.rollout.By == RolloutBySubject && rr.rollout.Share > 0 && rr.rollout.Share < FullShare {
		return "", false
	}
	mode, _ := RolloutModeFor(idx, route, p.Key.Subject, p.Rollout)
	return mode, true
}

// Empty reports whether no route belongs to a rollout.
func (idx Rollouts) Empty() bool { return len(idx.byRoute) == 0 }
