package sched

import "sync"

// Locked is a Scheduler behind a mutex, for a gateway whose goroutines
// enqueue, dispatch and settle concurrently. Every method holds the lock
// for one call of the Scheduler method of the same name and returns what
// that method returns; the dispatch order is then the order in which the
// goroutines get the lock, and is no longer deterministic.
type Locked struct {
	mu sync.Mutex
	s  *Scheduler
}

// NewLocked returns a Locked around New(cfg), or New's ErrInvalidConfig.
func NewLocked(cfg Config) (*Locked, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Locked{s: s}, nil
}

// SetTenant: see Scheduler.SetTenant.
func (l *Locked) SetTenant(name string, weight int64, priority int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.SetTenant(name, weight, priority)
}

// SetLevelWeight: see Scheduler.SetLevelWeight.
func (l *Locked) SetLevelWeight(priority int, weight int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.SetLevelWeight(priority, weight)
}

// Enqueue: see Scheduler.Enqueue.
func (l *Locked) Enqueue(r Request) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.Enqueue(r)
}

// Dispatch: see Scheduler.Dispatch.
func (l *Locked) Dispatch() (Request, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.Dispatch()
}

// Settle: see Scheduler.Settle.
func (l *Locked) Settle(reservationID string, actualCost int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.Settle(reservationID, actualCost)
}

// Len: see Scheduler.Len.
func (l *Locked) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.Len()
}

// InFlight: see Scheduler.InFlight.
func (l *Locked) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.InFlight()
}

// QueueLen: see Scheduler.QueueLen.
func (l *Locked) QueueLen(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.QueueLen(tenant)
}
