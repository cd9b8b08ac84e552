package sim

import (
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

type shardSim struct{}

func (s *shardSim) init(w *world)                                        {}
func (s *shardSim) quiescent(w *world) bool                              { return true }
func (w *world) shardWorker()                                            {}
func (w *world) shardChaos()                                             {}
func (w *world) shardEvent(a, b, c int32)                                {}
func (w *world) shardChanges(ch *store.Changes)                          {}
func (w *world) shardAudit(snap *ledger.Snapshot, why string)            {}
func (w *world) shardInternalAnswer(ic *internalCmd, res *ledger.Result) {}
func (w *world) shardInternalFailed(ic *internalCmd)                     {}
func (w *world) gatewayRestart(i int)                                    {}
