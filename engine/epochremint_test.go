package engine

import (
	"bytes"
	"crypto/ed25519"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// A shard reconciled after every generation of its subject's key was
// rolled back remints into the account that held the subject's capacity
// (nothing admits for the subject to take it elsewhere). That account
// was idle, its epoch long ended: the remint first closes that epoch, as
// every command does, so the one the remint lands in is new and the
// epoch worker closes it when it ends.
func TestEpochOfARemintWithNothingActiveCloses(t *testing.T) {
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			core := NewCore(st)
			p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
				Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}},
				EpochLength: 10 * time.Minute, EmergencyMode: true}.WithDefaults()
			commitAlone(t, core, t0, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			_, key, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
			commitAlone(t, core, t0.Add(time.Minute), ledger.Command{Kind: ledger.KindShardIssue, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
				Units: ledger.Amounts{10}, Shard: &ledger.ShardArgs{ShardID: "sh-1", GatewayID: "gw-1", BootEpoch: 1,
					TTL: 1000 * time.Hour, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
			var scans EpochScans
			if cmds := epochPass(t, core, t0.Add(11*time.Minute), &scans); len(cmds) != 1 {
				t.Fatalf("the issue's epoch: %d closes, want 1", len(cmds))
			}
			epochPass(t, core, t0.Add(2*time.Hour), &scans) // idle since
			commitAlone(t, core, t0.Add(2*time.Hour+time.Minute), ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: p.Key, Generation: 1})
			commitAlone(t, core, t0.Add(2*time.Hour+2*time.Minute), ledger.Command{Kind: ledger.KindShardReconcile,
				Shard: &ledger.ShardArgs{ShardID: "sh-1", GatewayID: "gw-1",
					Receipts: []ledger.ShardReceipt{{ReservationID: "s", State: ledger.StateSettled, Actual: ledger.Amounts{3}}}}})
			epochPass(t, core, t0.Add(2*time.Hour+3*time.Minute), &scans)
			now := t0.Add(2*time.Hour + 11*time.Minute)
			if cmds := epochPass(t, core, now, &scans); len(cmds) != 1 {
				t.Errorf("the remint's epoch of 16:00 ended: %d closes, want 1", len(cmds))
			}
			checkNoBusyEpochEnded(t, st, now, 0)
		})
	}
}
