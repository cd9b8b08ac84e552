package ledger

// Which generation decides for a subject is one rule, used by the ledger's
// commands, the engine's workers and views, the server's policy cache and
// the simulator's operator alike:
//
//  1. per policy key, the active generation is the newest one not rolled
//     back (publishing makes the new generation active; a rollback falls
//     back to the newest earlier one still live, or to none);
//  2. a concrete subject is decided by its own key's active generation,
//     else by the active generation of the route's AnySubject key, else by
//     none.
//
// Both halves live here; nothing else restates them.

// DecidingGeneration returns the generation that decides for the concrete
// subject key (rule 2), given active, which reports a policy key's active
// generation (rule 1) and false when the key has none. It returns false
// when neither the subject's own key nor the route's AnySubject key has an
// active generation. For an AnySubject key itself only that key counts.
func DecidingGeneration(subject PolicyKey, active func(PolicyKey) (uint64, bool)) (uint64, bool) {
	if g, ok := active(subject); ok && g != 0 {
		return g, true
	}
	if subject.Subject == AnySubject {
		return 0, false
	}
	if g, ok := active(PolicyKey{Subject: AnySubject, Route: subject.Route, Region: subject.Region}); ok && g != 0 {
		return g, true
	}
	return 0, false
}

// ActiveGenerations maps each policy key to its active generation (rule 1):
// the newest generation of the key that was not rolled back. A key whose
// generations are all rolled back is absent.
type ActiveGenerations map[PolicyKey]uint64

// NewActiveGenerations returns the active generation of every key among
// policies (in any order).
func NewActiveGenerations(policies []Policy) ActiveGenerations {
	active := make(ActiveGenerations, len(policies))
	for i := range policies {
		active.Add(&policies[i])
	}
	return active
}

// Add takes one more generation into account: it becomes its key's active
// one if it is live and newer than the active one. (A generation rolled
// back after it was added is forgotten only by rebuilding the map.)
func (a ActiveGenerations) Add(p *Policy) {
	if g := ActiveWith(a[p.Key], p.Generation, p.RolledBack); g != a[p.Key] {
		a[p.Key] = g
	}
}

// ActiveWith returns a key's active generation (rule 1) once one more of
// its generations is taken into account, given the active one so far (0
// for none): generation if it is live (not rolledBack) and newer, else
// active. For holders that keep a key's generations their own way (the
// server's policy cache) instead of an ActiveGenerations.
func ActiveWith(active, generation uint64, rolledBack bool) uint64 {
	if !rolledBack && generation > active {
		return generation
	}
	return active
}

// Active returns key's active generation, false when it has none.
func (a ActiveGenerations) Active(key PolicyKey) (uint64, bool) {
	g, ok := a[key]
	return g, ok && g != 0
}

// Deciding returns the generation that decides for the concrete subject
// key (DecidingGeneration over this map), false when none does.
func (a ActiveGenerations) Deciding(subject PolicyKey) (uint64, bool) {
	return DecidingGeneration(subject, a.Active)
}
