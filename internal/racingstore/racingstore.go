// Package racingstore is a store for tests of a command that races
// publishes: it publishes a new generation of a policy, as another replica
// would, each time the server catches its policy cache up after the ledger
// refused a command as stale (refreshStale's read of what was published
// since), while armed, so the command mapped again is stale again by the
// time it reaches the ledger, on every attempt.
package racingstore

import (
	"context"
	"sync"

	"github.com/capledger/capledger/store"
)

// Store wraps a store.Store; the zero publish is disarmed.
type Store struct {
	store.Store
	mu        sync.Mutex
	publish   func() // nil: disarmed
	inside    bool
	published int
}

// New wraps s, disarmed.
func New(s store.Store) *Store { return &Store{Store: s} }

// PolicyPage reads s's page, then (armed, and not already inside a
// publish of its own) publishes once.
func (s *Store) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	page, err := s.Store.PolicyPage(ctx, f)
	s.mu.Lock()
	publish := s.publish
	fire := publish != nil && !s.inside
	s.inside = s.inside || fire
	s.mu.Unlock()
	if fire {
		publish()
		s.mu.Lock()
		s.inside = false
		s.published++
		s.mu.Unlock()
	}
	return page, err
}

// Arm publishes once now, before the call, and on every catch-up after.
func (s *Store) Arm(publish func()) {
	s.mu.Lock()
	s.publish, s.published = publish, 0
	s.mu.Unlock()
	publish()
}

// Disarm stops it and returns how many catch-ups published since Arm.
func (s *Store) Disarm() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.publish = nil
	return s.published
}
