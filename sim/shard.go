package sim

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The simulation's shard signing key: fixed, so runs are deterministic
// (Ed25519 signatures are).
var (
	shardKey    = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{0x5e}, ed25519.SeedSize))
	shardKeyID  = "sim-key-1"
	shardKeys   = ledger.ShardKeyRing{shardKeyID: shardKey.Public().(ed25519.PublicKey)}
	shardSigner = ledger.Ed25519ShardSigner(shardKey)
)

// Shard timings.
const (
	shardEvery     = int64(5 * time.Second)
	shardTTLMin    = int64(20 * time.Second)
	shardTTLMax    = int64(90 * time.Second)
	shardQuietWait = int64(30 * time.Second) // longer than any network delay
	maxShardsPerGW = 2
)

type shardPhase uint8

const (
	shIssuing   shardPhase = iota + 1 // issue sent, no definite answer yet
	shLive                            // installed: the gateway may spend it
	shSealed                          // sealed: first submission not accepted yet
	shResolving                       // first submission accepted; unknown work may still resolve
	shClosing                         // issuance was refused: make sure no late copy issued it
	shDone
)

var shardPhaseNames = [...]string{"", "issuing", "live", "sealed", "resolving", "closing", "done"}

// simShard is one emergency shard as its gateway sees it: the signed
// document, the gateway-local ledger (ledger.ShardLocal, the same code the
// client SDK uses) and where reconciliation is.
type simShard struct {
	idx int32
	id  string
	// key is the shard's life as the checker keys it (lifeKey): retention
	// frees a removed shard's id, and a gateway may issue a new shard
	// under it (reuseShardID).
	key      string
	gw       int
	boot     uint64
	tenant   int
	units    ledger.Amounts
	ttl      time.Duration
	phase    shardPhase
	attempt  int32
	lastSend int64
	doc      *ledger.Shard
	local    *ledger.ShardLocal
	// inflight is the submission awaiting a definite answer (submitting
	// set): a retry resends exactly it, never a fresh Submission, so that
	// an "already reconciled" answer is about these very receipts.
	inflight   []ledger.ShardReceipt
	submitting bool
	// subs are the distinct submissions this gateway sent, in order (a
	// retry resends the last one); delivered[k] counts the copies of
	// subs[k] that reached the ledger process. They are the gateway's side
	// of reconciliation, against which the central shard row is checked.
	subs      [][]ledger.ShardReceipt
	delivered []int
	// localReqs are the requests this shard admitted.
	localReqs []int32
}

// shardSim is the emergency-shard part of an interleaving: the gateways'
// shards and, on the central side, what the checker saw of them.
type shardSim struct {
	on    bool
	list  []*simShard
	fence []uint64 // newest fence each gateway holds

	// Central side, from the committed changes.
	rows     map[string]ledger.Shard
	reminted map[string]ledger.Amounts
	// remintDropped marks, per shard, the dimensions a remint move's
	// target generation did not limit (their reminted units are not
	// carried, so they are not compared).
	remintDropped map[string]uint8
	issued        map[string]ledger.Amounts // RetiredForEmergency journaled per shard id
	// applied counts, per shard id, the reconciliations the central row
	// shows applied; charged sums the debt its remint moves charged.
	applied map[string]int
	charged map[string]ledger.Amounts
	byLife  map[string]*simShard
	// life is each shard id's current life (0 its first shard, n its n-th
	// reuse); the maps above and below are keyed by lifeKey, so that the
	// shards under one id are told apart.
	life map[string]int
	// Retention (sim/shardretention.go): removed marks the shards the
	// retention worker removed (their last row stays in rows), lastRemint
	// is each shard's latest remint move and moves counts them, retained
	// the checker's own retained shard totals per account.
	removed    map[string]bool
	lastRemint map[string]time.Time
	moves      map[string]int64
	retained   map[ledger.AccountKey]*ledger.RetainedShards
	// reusable lists the ids whose current life retention removed, not
	// reused yet; removedAt is when (sim ns) the id's life was removed.
	reusable  []string
	removedAt map[string]int64
	// removedCount counts the removals, lateResends the gateways'
	// resubmissions for a removed shard (each answered SHARD_NOT_FOUND,
	// moving nothing), reissued the shards the ledger issued under the id
	// of a removed one.
	removedCount, lateResends, reissued int64
	// countedRemovals is removedCount at the end of the last pass.
	countedRemovals int64
}

func gatewayID(gw int) string { return "gw" + strconv.Itoa(gw) }

func (s *shardSim) init(w *world) {
	s.fence = make([]uint64, w.shape.gateways)
	s.rows = map[string]ledger.Shard{}
	s.reminted = map[string]ledger.Amounts{}
	s.remintDropped = map[string]uint8{}
	s.issued = map[string]ledger.Amounts{}
	s.applied = map[string]int{}
	s.charged = map[string]ledger.Amounts{}
	s.byLife = map[string]*simShard{}
	s.life = map[string]int{}
	s.removedAt = map[string]int64{}
	s.removed = map[string]bool{}
	s.lastRemint = map[string]time.Time{}
	s.moves = map[string]int64{}
	s.retained = map[ledger.AccountKey]*ledger.RetainedShards{}
	if s.on {
		w.after(shardEvery, evShard, shardEvTick, 0, 0)
	}
}

// evShard sub-kinds.
const (
	shardEvTick    = 1
	shardEvTimeout = 2
	shardEvOpDone  = 3
)

func (w *world) shardEvent(kind, b, c int32) {
	switch kind {
	case shardEvTick:
		w.shardTick()
	case shardEvTimeout:
		sh := w.shards.list[b]
		if sh.attempt != c {
			return
		}
		w.log(recTimeout, w.gatewayNode(sh.gw), 0, sh.id, int64(c), shardPhaseNames[sh.phase])
		switch sh.phase {
		case shIssuing:
			w.sendIssue(sh)
		case shSealed, shResolving, shClosing:
			if sh.submitting {
				w.sendReconcile(sh, sh.inflight, false)
			}
		}
	case shardEvOpDone:
		w.shardOpDone(b)
	}
}

// shardTick is each gateway's shard housekeeping: while the ledger is
// healthy it takes a shard now and then; it seals shards that expired or
// whose gateway is back in touch, and submits their receipts for
// reconciliation until everything is resolved.
func (w *world) shardTick() {
	w.after(shardEvery, evShard, shardEvTick, 0, 0)
	s := &w.shards
	if !w.healed {
		for g := 0; g < w.shape.gateways; g++ {
			if w.cut[w.gatewayNode(g)] || !w.chance(0.1) || s.busy(g, w.gateways[g].bootEpoch) >= 1 || s.count(g) >= maxShardsPerGW {
				continue
			}
			w.issueShard(g, w.rng.IntN(w.shape.tenants))
		}
	}
	for _, sh := range s.list {
		cut := w.cut[w.gatewayNode(sh.gw)]
		switch sh.phase {
		case shLive:
			expired := !w.time().Before(sh.doc.ExpiresAt)
			if expired || w.healed || (!cut && w.chance(0.2)) {
				sh.local.Seal(w.time())
				w.checkLocal(sh)
				sh.phase = shSealed
				w.log(recShard, w.gatewayNode(sh.gw), 0, sh.id, 0, "sealed")
			}
		case shClosing:
			if !sh.submitting && !cut && w.now-sh.lastSend > shardQuietWait {
				w.sendReconcile(sh, nil, true)
			}
			continue
		}
		if (sh.phase == shSealed || sh.phase == shResolving) && !sh.submitting && !cut {
			if receipts, ok := sh.local.Submission(); ok {
				w.sendReconcile(sh, receipts, true)
			} else if sh.phase == shResolving {
				w.maybeShardDone(sh)
			}
		}
	}
}

func (s *shardSim) busy(g int, boot uint64) int {
	n := 0
	for _, sh := range s.list {
		if sh.gw == g && sh.boot == boot && (sh.phase == shIssuing || sh.phase == shLive) {
			n++
		}
	}
	return n
}

func (s *shardSim) count(g int) int {
	n := 0
	for _, sh := range s.list {
		if sh.gw == g {
			n++
		}
	}
	return n
}

// issueShard asks the ledger for a shard for gateway g's current process.
func (w *world) issueShard(g, tenant int) {
	s := &w.shards
	p := w.op.base[w.tenants[tenant].key]
	sh := &simShard{
		idx:    int32(len(s.list)),
		gw:     g,
		boot:   w.gateways[g].bootEpoch,
		tenant: tenant,
		ttl:    time.Duration(w.between(shardTTLMin, shardTTLMax)),
		phase:  shIssuing,
	}
	sh.id = fmt.Sprintf("sh-%s-b%d-%d", gatewayID(g), sh.boot, sh.idx)
	sh.key = sh.id
	if id, ok := w.reuseShardID(); ok {
		sh.id, sh.key = id, lifeKey(id, s.life[id]+1)
		w.log(recShard, w.gatewayNode(g), ledger.KindShardIssue, sh.id, int64(s.life[id]+1), "reuses the id of a shard retention removed")
	}
	sh.units[0] = w.between(p.Dimensions[0].Burst/6, p.Dimensions[0].Burst/3)
	for d := 1; d < min(len(p.Dimensions), w.activeDims(tenant)); d++ {
		sh.units[d] = 2
	}
	s.list = append(s.list, sh)
	s.byLife[sh.key] = sh
	w.log(recShard, w.gatewayNode(g), ledger.KindShardIssue, sh.id, sh.units[0], "issue")
	w.sendIssue(sh)
}

func (w *world) sendIssue(sh *simShard) {
	sh.attempt++
	sh.lastSend = w.now
	t := &w.tenants[sh.tenant]
	node := w.gatewayNode(sh.gw)
	cmd := ledger.Command{Kind: ledger.KindShardIssue, Subject: t.subject, Route: route, Region: region, Units: sh.units,
		Shard: &ledger.ShardArgs{ShardID: sh.id, GatewayID: gatewayID(sh.gw), BootEpoch: sh.boot, TTL: sh.ttl,
			KeyID: shardKeyID, Sign: shardSigner}}
	w.send(&message{kind: msgCommand, from: node, to: ledgerNodeID, owner: sh.idx, attempt: sh.attempt, cmd: cmd})
	w.after(rpcTimeout, evShard, shardEvTimeout, sh.idx, sh.attempt)
}

// sendReconcile submits receipts (nil: an empty submission, to close a
// shard whose issuance was refused, in case a late copy issued it). fresh
// says it is a new submission rather than a resend of the one in flight.
func (w *world) sendReconcile(sh *simShard, receipts []ledger.ShardReceipt, fresh bool) {
	sh.attempt++
	sh.lastSend = w.now
	sh.inflight = receipts
	sh.submitting = true
	if fresh || len(sh.subs) == 0 {
		sh.subs = append(sh.subs, receipts)
		sh.delivered = append(sh.delivered, 0)
	}
	node := w.gatewayNode(sh.gw)
	m := &message{kind: msgCommand, from: node, to: ledgerNodeID, owner: sh.idx, attempt: sh.attempt, sub: int32(len(sh.subs)),
		cmd: ledger.Command{Kind: ledger.KindShardReconcile,
			Shard: &ledger.ShardArgs{ShardID: sh.id, GatewayID: gatewayID(sh.gw), Receipts: receipts}}}
	w.send(m)
	if w.f.fire(SiteDuplicateRecovery) {
		dup := *m
		w.send(&dup)
	}
	w.after(rpcTimeout, evShard, shardEvTimeout, sh.idx, sh.attempt)
}

// shardAnswer handles the ledger's answer to a shard command.
func (w *world) shardAnswer(m *message) {
	sh := w.shards.list[m.owner]
	node := w.gatewayNode(sh.gw)
	w.log(recDeliver, node, m.cmd.Kind, sh.id, int64(m.attempt), msgNames[m.kind])
	if m.probe {
		w.foreignProbeAnswer(sh, m)
		return
	}
	if m.late {
		w.lateShardAnswer(sh, m)
		return
	}
	if m.attempt != sh.attempt {
		w.log(recStale, node, m.cmd.Kind, sh.id, int64(m.attempt), "")
		return
	}
	if m.kind == msgUnavailable {
		if sh.phase == shIssuing {
			w.sendIssue(sh)
		} else if sh.submitting {
			w.sendReconcile(sh, sh.inflight, false)
		}
		return
	}
	res := m.res
	sh.attempt++ // a duplicate of this answer is stale from now on
	switch m.cmd.Kind {
	case ledger.KindShardIssue:
		if sh.phase != shIssuing {
			return
		}
		w.issueAnswer(sh, res)
	case ledger.KindShardReconcile:
		w.reconcileAnswer(sh, m)
	}
}

func (w *world) issueAnswer(sh *simShard, res *ledger.Result) {
	switch {
	case res.Err == nil:
	case res.Rejected(), errors.Is(res.Err, ledger.ErrEmergencyDisabled), errors.Is(res.Err, ledger.ErrNoPolicy),
		// A generation dropping a unit after tokens, published since the
		// shard was drawn, refuses its units in it (a shard holds 2 of
		// each unit after tokens that it holds any of).
		errors.Is(res.Err, ledger.ErrInvalidCommand) && res.Generation != 0 && sh.units[1] != 0:
		// Nothing was issued by this attempt; a late copy still might be,
		// so the shard is closed later by an empty reconciliation.
		sh.phase = shClosing
		w.log(recShard, w.gatewayNode(sh.gw), ledger.KindShardIssue, sh.id, 0, "refused: "+res.Err.Error())
		return
	default:
		w.violate(GateProtocol, fmt.Sprintf("shard issue %s answered %v", sh.id, res.Err))
		return
	}
	doc := res.Shard
	if doc == nil || doc.ID != sh.id || doc.GatewayID != gatewayID(sh.gw) || doc.BootEpoch != sh.boot || doc.Allocated != sh.units {
		w.violate(GateProtocol, fmt.Sprintf("shard issue %s answered %+v", sh.id, doc))
		return
	}
	sh.doc = doc
	sh.local = ledger.NewShardLocal(doc)
	g := &w.gateways[sh.gw]
	holder := ledger.ShardHolder{GatewayID: gatewayID(sh.gw), BootEpoch: g.bootEpoch, NewestFence: w.shards.fence[sh.gw]}
	err := ledger.VerifyShard(doc, shardKeys, holder, w.time())
	switch {
	case err == nil:
		sh.phase = shLive
		w.shards.fence[sh.gw] = max(w.shards.fence[sh.gw], doc.Fence)
		w.log(recShard, w.gatewayNode(sh.gw), ledger.KindShardIssue, sh.id, int64(doc.Fence), "installed")
	case sh.boot != g.bootEpoch && errors.Is(err, ledger.ErrShardBootEpoch),
		errors.Is(err, ledger.ErrShardExpired), errors.Is(err, ledger.ErrShardFenced):
		// Issued to a process that has since restarted, or too late to
		// spend: never installed, reconciled whole.
		sh.local.Inherit(w.time())
		sh.phase = shSealed
		w.log(recShard, w.gatewayNode(sh.gw), ledger.KindShardIssue, sh.id, 0, "not installable: "+err.Error())
	default:
		w.violate(GateProtocol, fmt.Sprintf("shard %s issued to this gateway fails verification: %v", sh.id, err))
	}
}

func (w *world) reconcileAnswer(sh *simShard, m *message) {
	receipts, res := m.cmd.Shard.Receipts, m.res
	if !sh.submitting {
		return
	}
	sent := sh.inflight
	sh.submitting, sh.inflight = false, nil
	firstAccepted := sh.local != nil
	if firstAccepted {
		firstAccepted, _ = sh.local.Reconciled()
	}
	switch {
	case res.Err == nil:
	case errors.Is(res.Err, ledger.ErrShardAlreadyReconciled):
		// Correct only when an earlier copy of this very submission reached
		// the ledger and was applied (its answer lost, or a duplicate got
		// there first): a refusal of a submission the ledger never applied
		// would leave its receipts unresolved for good.
		if !w.shardCopyApplied(sh, int(m.sub)) {
			return
		}
	case errors.Is(res.Err, ledger.ErrInvalidCommand) && !firstAccepted && res.Shard != nil && res.Shard.Reconciled:
		if !w.shardCopyApplied(sh, int(m.sub)) {
			return
		}
		// The retry of a first submission made only of unknown receipts is
		// refused as invalid (it looks like a later submission of
		// non-terminal receipts), but the shard shows that the earlier
		// attempt took effect: only this gateway can reconcile it.
		w.log(recShard, w.gatewayNode(sh.gw), ledger.KindShardReconcile, sh.id, 0, "retry refused as invalid; the shard shows the first attempt took effect")
	case sh.phase == shClosing && errors.Is(res.Err, ledger.ErrShardNotFound) && w.shards.removed[sh.key]:
		// A late copy did issue it, an earlier copy of this closing
		// submission reconciled it whole (its answer lost), and retention
		// removed it since: the gateway, never having held it, takes
		// SHARD_NOT_FOUND as "nothing to close", which is right only if
		// that earlier copy was applied.
		if !w.shardRemovedApplied(sh, int(m.sub)) {
			return
		}
		sh.phase = shDone
		w.log(recShard, w.gatewayNode(sh.gw), 0, sh.id, 0, "closed: issued late, reconciled whole by an earlier copy, removed by retention")
		return
	case sh.phase == shClosing && errors.Is(res.Err, ledger.ErrShardNotFound):
		sh.phase = shDone
		w.log(recShard, w.gatewayNode(sh.gw), 0, sh.id, 0, "closed: never issued")
		return
	case errors.Is(res.Err, ledger.ErrShardNotFound) && w.shards.removed[sh.key]:
		// Retention removed the shard since: correct only when an earlier
		// copy of this very submission was applied (docs/API.md: the
		// gateway takes it as accepted).
		if !w.shardRemovedApplied(sh, int(m.sub)) {
			return
		}
		w.log(recShard, w.gatewayNode(sh.gw), ledger.KindShardReconcile, sh.id, 0, "retry answered SHARD_NOT_FOUND: removed by retention after it was applied")
	default:
		w.violate(GateProtocol, fmt.Sprintf("shard reconcile %s answered %v", sh.id, res.Err))
		return
	}
	if sh.phase == shClosing {
		// A late copy did issue it: reconcile it whole.
		if sh.local == nil && res.Shard != nil {
			sh.doc = res.Shard
			sh.local = ledger.NewShardLocal(res.Shard)
			sh.local.Inherit(w.time())
		}
		if sh.local == nil {
			w.violate(GateProtocol, fmt.Sprintf("closing reconcile of %s answered %v without the shard", sh.id, res.Err))
			return
		}
		sh.phase = shSealed
	}
	if sent == nil {
		sent = receipts
	}
	sh.local.Submitted(sent)
	sh.phase = shResolving
	w.log(recShard, w.gatewayNode(sh.gw), ledger.KindShardReconcile, sh.id, int64(len(sent)), "accepted")
	w.maybeShardDone(sh)
}

func (w *world) maybeShardDone(sh *simShard) {
	done, pending := sh.local.Reconciled()
	if !done || pending > 0 {
		return
	}
	for _, idx := range sh.localReqs {
		if w.requests[idx].phase != phDone {
			return
		}
	}
	if _, more := sh.local.Submission(); more {
		return
	}
	sh.phase = shDone
	w.log(recShard, w.gatewayNode(sh.gw), 0, sh.id, 0, "reconciled")
}

// tryShard serves a request from the gateway's live shard when the gateway
// cannot reach the ledger. It returns false when the request must go to
// the ledger (no live shard for the tenant, or the shard refused it).
func (w *world) tryShard(r *request) bool {
	s := &w.shards
	if !s.on || !w.cut[w.gatewayNode(r.gw)] {
		return false
	}
	g := &w.gateways[r.gw]
	for _, sh := range s.list {
		if sh.gw != r.gw || sh.phase != shLive || sh.tenant != r.tenant || sh.boot != g.bootEpoch {
			continue
		}
		// The signature was verified when the shard was installed; the
		// local ledger refuses it once expired or sealed.
		if sh.doc.Fence < s.fence[r.gw] {
			continue
		}
		now := w.time()
		res := sh.local.Reserve(r.id, r.digest, r.units, now)
		w.checkLocal(sh)
		if res.Err != nil {
			continue
		}
		r.viaShard = sh.idx + 1
		r.opID = "op-" + r.id
		res = sh.local.Start(r.id, r.opID, now)
		w.checkLocal(sh)
		if res.Err != nil {
			w.violate(GateProtocol, fmt.Sprintf("local start of %s on shard %s: %v", r.id, sh.id, res.Err))
			return true
		}
		sh.localReqs = append(sh.localReqs, r.idx)
		r.phase = phDispatched
		r.opPhase = opRunning
		w.log(recShard, w.gatewayNode(r.gw), ledger.KindReserve, r.id, r.units[0], "admitted by "+sh.id)
		w.after(w.between(int64(200*time.Millisecond), int64(10*time.Second)), evShard, shardEvOpDone, r.idx, 0)
		return true
	}
	return false
}

// shardOpDone settles a shard-admitted operation locally with its receipt
// (also after the shard was sealed or inherited by a restarted process).
func (w *world) shardOpDone(idx int32) {
	r := w.requests[idx]
	sh := w.shards.list[r.viaShard-1]
	w.drawActual(r)
	res := sh.local.Settle(r.id, r.opID, r.actual, w.time())
	w.checkLocal(sh)
	if res.Err != nil {
		w.violate(GateUnknownAsUnconsumed, fmt.Sprintf("local settle of %s on shard %s with its receipt: %v", r.id, sh.id, res.Err))
		return
	}
	r.opPhase = opDone
	w.done(r, outSettled)
}

// checkLocal runs the shard's own conservation check.
func (w *world) checkLocal(sh *simShard) {
	if err := sh.local.Check(); err != nil {
		w.violate(GateShardConservation, err.Error())
	}
}

// shardChaos rolls the shard misuse sites: another gateway trying to
// spend (and reconcile) a gateway's shard, and a gateway restarting and
// replaying its previous process's shard.
func (w *world) shardChaos() {
	s := &w.shards
	if !s.on {
		return
	}
	var live []*simShard
	for _, sh := range s.list {
		if sh.phase == shLive {
			live = append(live, sh)
		}
	}
	if len(live) == 0 {
		return
	}
	sh := live[w.rng.IntN(len(live))]
	if w.f.fire(SiteShardReuse) {
		other := (sh.gw + 1 + w.rng.IntN(w.shape.gateways-1)) % w.shape.gateways
		og := &w.gateways[other]
		holder := ledger.ShardHolder{GatewayID: gatewayID(other), BootEpoch: og.bootEpoch, NewestFence: s.fence[other]}
		err := ledger.VerifyShard(sh.doc, shardKeys, holder, w.time())
		w.log(recShard, w.gatewayNode(other), 0, sh.id, 0, fmt.Sprintf("tries another gateway's shard: %v", err))
		if !errors.Is(err, ledger.ErrShardForeign) {
			w.violate(GateDuplicateShardConsumption, fmt.Sprintf("gateway %s may spend %s's shard %s: verification says %v",
				gatewayID(other), gatewayID(sh.gw), sh.id, err))
			return
		}
		// It also tries to reconcile it as its own.
		w.send(&message{kind: msgCommand, from: w.gatewayNode(other), to: ledgerNodeID, owner: sh.idx, probe: true,
			cmd: ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: sh.id, GatewayID: gatewayID(other)}}})
	}
	if w.f.fire(SiteShardReplayAfterRestart) {
		w.restartGateway(sh.gw)
		g := &w.gateways[sh.gw]
		holder := ledger.ShardHolder{GatewayID: gatewayID(sh.gw), BootEpoch: g.bootEpoch, NewestFence: s.fence[sh.gw]}
		err := ledger.VerifyShard(sh.doc, shardKeys, holder, w.time())
		w.log(recShard, w.gatewayNode(sh.gw), 0, sh.id, int64(g.bootEpoch), fmt.Sprintf("restarted process replays its old shard: %v", err))
		if !errors.Is(err, ledger.ErrShardBootEpoch) {
			w.violate(GateDuplicateShardConsumption, fmt.Sprintf("restarted gateway %s (boot %d) may spend its previous boot's shard %s: verification says %v",
				gatewayID(sh.gw), g.bootEpoch, sh.id, err))
		}
	}
}

// foreignProbeAnswer checks the answer to another gateway's attempt to
// reconcile a shard that is not its own.
func (w *world) foreignProbeAnswer(sh *simShard, m *message) {
	if m.kind != msgAnswer {
		return
	}
	if errors.Is(m.res.Err, ledger.ErrShardNotFound) && w.shards.removed[sh.key] {
		// Retention removed the shard before the probe arrived: there is
		// nothing left to consume (shardChanges checks no row names it).
		return
	}
	if !errors.Is(m.res.Err, ledger.ErrShardForeign) {
		w.violate(GateDuplicateShardConsumption, fmt.Sprintf("another gateway's reconciliation of shard %s answered %v, not %v",
			sh.id, m.res.Err, ledger.ErrShardForeign))
	}
}

// restartGateway restarts a gateway process: a new boot epoch. Its shards
// are inherited, never spent again: sealed, with started work marked
// USAGE_UNKNOWN until its operation receipt settles it.
func (w *world) restartGateway(g int) {
	gw := &w.gateways[g]
	gw.bootEpoch++
	w.log(recRestart, w.gatewayNode(g), 0, "", int64(gw.bootEpoch), "gateway restarted")
	for _, sh := range w.shards.list {
		if sh.gw != g || sh.local == nil || sh.boot == gw.bootEpoch {
			continue
		}
		sh.local.Inherit(w.time())
		w.checkLocal(sh)
		if sh.phase == shLive {
			sh.phase = shSealed
		}
	}
}

// shardChanges checks what a commit did to shards on the central side:
// each issuance retires exactly its allocation, a reconciled shard splits
// its allocation exactly into spent, unknown and reminted, unknown only
// shrinks, and what was reminted equals the remint moves, once each.
func (w *world) shardChanges(ch *store.Changes) {
	s := &w.shards
	if len(s.removed) > 0 && len(ch.Meta) > 0 {
		w.removedShardMeta(ch)
		if w.fail != nil {
			return
		}
	}
	for i := range ch.Moves {
		m := &ch.Moves[i]
		if m.Kind != ledger.MoveShardRemint {
			continue
		}
		id, _ := ledger.ShardOfRemint(m.ReceiptID)
		key := s.remintLife(id, m.ReceiptID)
		if key == "" {
			w.violate(GateDuplicateRecovery, fmt.Sprintf("remint move %s names shard %s issued at a time none of its shards was", m.ReceiptID, id))
			return
		}
		if s.removed[key] {
			w.violate(GateDuplicateRecovery, fmt.Sprintf("shard %s reminted %v again (move %s) after retention removed it", key, m.Units, m.ReceiptID))
			return
		}
		s.moves[key]++
		if m.At.After(s.lastRemint[key]) {
			s.lastRemint[key] = m.At
		}
		w.remintDebtRecorded(m, ch)
		if w.fail != nil {
			return
		}
		sum, debt := s.reminted[key], s.charged[key]
		// A unit the target's generation does not limit: the shard counts
		// it reminted, but it stays retired at the source
		// (ledger.remintShard) and the move carries none of it.
		s.remintDropped[key] |= w.droppedDims(m.From.Generation, m.To.Generation)
		for d := range sum {
			sum[d] += m.Units[d]
			debt[d] += m.Debt[d]
		}
		s.reminted[key] = sum
		s.charged[key] = debt
	}
	for i := range ch.Shards {
		row := &ch.Shards[i]
		key := s.key(row.ID)
		if s.removed[key] {
			for n := s.life[row.ID]; n >= 0; n-- {
				if old := lifeKey(row.ID, n); s.rows[old].IssuedAt.Equal(row.IssuedAt) {
					w.violate(GateDuplicateShardConsumption, fmt.Sprintf("shard %s written again (%+v) after retention removed it", old, *row))
					return
				}
			}
			// A new shard under a removed shard's id (docs/API.md: the
			// id is free again): the id's next life, checked as any
			// other shard.
			s.life[row.ID]++
			key = s.key(row.ID)
			s.reissued++
		}
		prev, seen := s.rows[key]
		if !seen && s.issued[row.ID] != row.Allocated {
			w.violate(GateShardConservation, fmt.Sprintf("shard %s allocates %v, but its issuance retired %v", row.ID, row.Allocated, s.issued[row.ID]))
			return
		}
		if seen && (!prev.IssuedAt.Equal(row.IssuedAt) || prev.Allocated != row.Allocated || prev.GatewayID != row.GatewayID || prev.BootEpoch != row.BootEpoch || prev.Account != row.Account) {
			w.violate(GateDuplicateShardConsumption, fmt.Sprintf("shard %s was re-issued: %+v became %+v", row.ID, prev, *row))
			return
		}
		for d := range row.Allocated {
			if row.Reconciled && (row.Spent[d]+row.Unknown[d]+row.Reminted[d] != row.Allocated[d] ||
				row.Spent[d] < 0 || row.Unknown[d] < 0 || row.Reminted[d] < 0) {
				w.violate(GateShardConservation, fmt.Sprintf("shard %s dimension %d: allocated %d != spent %d + unknown %d + reminted %d",
					row.ID, d, row.Allocated[d], row.Spent[d], row.Unknown[d], row.Reminted[d]))
				return
			}
			if seen && prev.Reconciled && (row.Unknown[d] > prev.Unknown[d] || row.Spent[d] < prev.Spent[d]) {
				w.violate(GateShardConservation, fmt.Sprintf("shard %s dimension %d: unknown %d -> %d, spent %d -> %d (unknown may only resolve)",
					row.ID, d, prev.Unknown[d], row.Unknown[d], prev.Spent[d], row.Spent[d]))
				return
			}
		}
		if want := maskDims(row.Reminted, s.remintDropped[key]); s.reminted[key] != want {
			w.violate(GateDuplicateRecovery, fmt.Sprintf("shard %s records %v reminted, its remint moves carried %v", key, row.Reminted, s.reminted[key]))
			return
		}
		if row.Reconciled {
			// Only an accepted submission writes a reconciled row (a
			// refusal counts itself in meta only).
			w.shardRowApplied(row)
		}
		if w.fail != nil {
			return
		}
		s.rows[key] = *row
	}
	for _, id := range ch.RemovedShards {
		w.shardRemoved(id)
		if w.fail != nil {
			return
		}
	}
}

// shardIssued records what an issuance journal entry retired.
func (s *shardSim) shardIssued(e *ledger.JournalEntry) {
	var units ledger.Amounts
	for d := range units {
		units[d] = e.Delta[d].RetiredForEmergency
	}
	s.issued[e.ReceiptID] = units
}

// shardAudit compares the store's shards with what was seen committed.
func (w *world) shardAudit(snap *ledger.Snapshot, why string) {
	s := &w.shards
	if len(snap.Shards) != len(s.rows)-len(s.removed) {
		w.violate(GateJournal, fmt.Sprintf("%s: the store has %d shards, %d were committed and %d removed by retention", why, len(snap.Shards), len(s.rows), len(s.removed)))
		return
	}
	for i := range snap.Shards {
		row := &snap.Shards[i]
		key := s.key(row.ID)
		prev, ok := s.rows[key]
		if !ok || s.removed[key] || prev.Spent != row.Spent || prev.Unknown != row.Unknown || prev.Reminted != row.Reminted || prev.Reconciled != row.Reconciled {
			w.violate(GateJournal, fmt.Sprintf("%s: store shard %s differs from everything committed", why, row.ID))
			return
		}
	}
	w.retainedShardsAudit(snap, why)
}

// quiescent reports whether every shard was reconciled with nothing left
// unknown, centrally and locally.
func (s *shardSim) quiescent(w *world) bool {
	for _, sh := range s.list {
		if sh.phase != shDone {
			return false
		}
	}
	for _, row := range s.rows {
		if !row.Reconciled || row.Unknown != (ledger.Amounts{}) {
			return false
		}
	}
	return true
}

func (s *shardSim) openSummary() string {
	var parts []string
	for _, sh := range s.list {
		if sh.phase != shDone {
			parts = append(parts, sh.id+"="+shardPhaseNames[sh.phase])
		}
	}
	return strings.Join(parts, ", ")
}

// remintDebtRecorded checks that the debt remint move m charges is
// issued, in the same commit, at the end of the move that limits its
// unit: at the destination, or, in a unit the destination's generation
// does not limit, at the shard's own account (ledger.remintShard), each
// journaled under the move's receipt. Debt charged nowhere (the
// shard_dropped_debt_skipped mutant) is caught by the shard's charged
// total (shardRowApplied).
func (w *world) remintDebtRecorded(m *ledger.Move, ch *store.Changes) {
	w.op.refresh(w)
	fp, tp := w.op.policy(m.From.Generation), w.op.policy(m.To.Generation)
	if fp == nil || tp == nil {
		return
	}
	issued := func(account ledger.AccountKey, d int) ledger.Units {
		var sum ledger.Units
		for i := range ch.Journal {
			if e := &ch.Journal[i]; e.ReceiptID == m.ReceiptID && e.Account == account {
				sum += e.Delta[d].OverdraftIssued
			}
		}
		return sum
	}
	for d := range fp.Dimensions {
		end, j := m.To, tp.DimensionIndex(fp.Dimensions[d].Unit)
		if j < 0 {
			end, j = m.From, d
		}
		if got := issued(end, j); got != m.Debt[d] {
			w.violate(GateUnrecordedDebt, fmt.Sprintf("remint move %s charges %d %s beyond the shard, but %s journaled %d debt issued for it",
				m.ReceiptID, m.Debt[d], fp.Dimensions[d].Unit, end, got))
			return
		}
	}
}

// droppedDims marks the dimensions of generation from whose unit
// generation to does not limit (bit d for dimension d).
func (w *world) droppedDims(from, to uint64) uint8 {
	w.op.refresh(w)
	fp, tp := w.op.policy(from), w.op.policy(to)
	if fp == nil || tp == nil {
		return 0
	}
	var dropped uint8
	for d := range fp.Dimensions {
		if tp.DimensionIndex(fp.Dimensions[d].Unit) < 0 {
			dropped |= 1 << d
		}
	}
	return dropped
}

// maskDims returns units with the dimensions marked in mask zeroed.
func maskDims(units ledger.Amounts, mask uint8) ledger.Amounts {
	for d := range units {
		if mask&(1<<d) != 0 {
			units[d] = 0
		}
	}
	return units
}
