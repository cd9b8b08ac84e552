// Package sched is a weighted fair queue over requests that already hold a
// ledger reservation.
//
// The ledger decides whether a request may run at all (it reserved the
// estimated cost); sched only decides in which order the already-RESERVED
// requests run when more are waiting than the backend has room for. It
// never admits anything: a request without a reservation id or with a
// non-positive estimate is refused.
//
// # Algorithm
//
// Within one priority level, tenants are served by self-clocked weighted
// fair queuing (Golestani's SCFQ) on the reserved, estimated cost:
//
//   - every tenant has a virtual time v (int64, in cost units scaled by
//     VirtualScale and divided by the tenant's weight);
//   - the head request of a backlogged tenant has the virtual finish time
//     v + EstimatedCost*VirtualScale/weight, and Dispatch takes the request
//     with the smallest finish time (ties: earliest enqueued);
//   - dispatching sets the tenant's v to that finish time and moves the
//     level's clock V to it if it is larger;
//   - Settle corrects v by the difference between the estimate G and the
//     actual cost S, as Kubernetes API Priority and Fairness does: v moves
//     back by (G-S)*VirtualScale/weight when S < G, forward when S > G;
//   - a tenant that becomes backlogged again starts at
//     max(v, V - Quantum*VirtualScale/weight): an idle tenant earns at most
//     one quantum of credit;
//   - a tenant with nothing queued or in flight, behind its level's clock by
//     at least the largest credit, is forgotten (a few are looked at per
//     call): it would come back exactly as a fresh tenant, so memory follows
//     the tenants in use and the order does not change (see Scheduler);
//   - for the same reason a kept idle tenant with its whole credit is a new
//     tenant to SetTenant: a new weight or priority gives it a new tenant's
//     credit at that weight and level.
//
// Priority levels are either weighted (the default, PriorityWeighted: the
// levels share dispatches by their own weights with the same SCFQ rule one
// layer up, so no level starves) or strict (PriorityStrict: the highest
// non-empty level always goes first). docs/FAIRNESS.md explains the choice
// and states the fairness and bounded-wait guarantees.
//
// # Determinism
//
// The scheduler reads no clock, starts no goroutines and draws no random
// numbers: virtual time advances with dispatched cost only, and every tie is
// broken by enqueue order. The same calls in the same order give the same
// dispatch order, so a simulator and tests can drive it. Queue accounting
// uses int64 only; floating point appears only in the fairness Meter.
//
// A Scheduler is not safe for concurrent use; Locked wraps one with a mutex
// for a gateway that dispatches from several goroutines.
package sched
