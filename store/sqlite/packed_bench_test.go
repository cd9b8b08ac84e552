package sqlite

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// BenchmarkPackedTableChurn reads tenants at random through a packed
// account table of a tenth of their number, remembering each miss (as a
// transaction does): nearly every op is a miss that evicts. A hot set of
// 10 tenants is the other case (every op a hit).
func BenchmarkPackedTableChurn(b *testing.B) {
	const tenants = 20000
	keys := make([]ledger.AccountKey, tenants)
	rows := make([]ledger.Account, tenants)
	for i := range keys {
		keys[i] = ledger.AccountKey{Subject: fmt.Sprintf("bench-%d", i), Route: "bench.reserve", Region: "global", Generation: 1}
		rows[i] = ledger.Account{Key: keys[i], Dims: 1, Version: 3}
		rows[i].Balances[0] = ledger.Balance{Minted: 1_000_000_000, Available: 1_000_000_000 - 200, Reserved: 200}
	}
	for _, over := range []int{10, tenants} {
		b.Run(fmt.Sprintf("subjects=%d", over), func(b *testing.B) {
			table := newPackedTable(tenants/10, accountCodec)
			rng := rand.New(rand.NewPCG(1, 2))
			b.ReportAllocs()
			for range b.N {
				i := rng.IntN(over)
				if _, ok, _ := table.lookupRow(keys[i], nil); !ok {
					table.rememberRow(keys[i], &rows[i], nil)
				}
			}
		})
	}
}

// BenchmarkPackedTableUpdate is the row cache's side of a batch over a
// million cached accounts: read 100 at random, then write each back after
// the commit, by looking it up again (rememberRow) or into the slot the
// read found (rememberAt; the slot kept, as Tx.storedEpochs keeps it, in
// a map of the batch's accounts read twice after its write). An op is one account, read and written;
// cpu-ns/op is the process's CPU time (the GC's included), which varies
// less than ns/op on a shared machine.
//
//	go test -run '^$' -bench PackedTableUpdate -count 6 ./store/sqlite
func BenchmarkPackedTableUpdate(b *testing.B) {
	const tenants, batch = 1_000_000, 100
	table := newPackedTable(tenants, accountCodec)
	keys := make([]ledger.AccountKey, tenants)
	for i := range keys {
		keys[i] = ledger.AccountKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat.generate", Region: "eu", Generation: 1}
		row := ledger.Account{Key: keys[i], Dims: 1, Version: 3}
		row.Balances[0] = ledger.Balance{Minted: 1_000_000_000, Available: 1_000_000_000 - 200, Reserved: 200}
		table.rememberRow(keys[i], &row, nil)
	}
	for _, hinted := range []bool{false, true} {
		b.Run(fmt.Sprintf("slot-hint=%v", hinted), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			picked := make([]int, batch)
			rows := make([]*ledger.Account, batch)
			noted := make(map[ledger.AccountKey]int32, batch)
			runtime.GC()
			cpu := benchCPU()
			b.ResetTimer()
			for n := 0; n < b.N; n += batch {
				for j := range picked {
					picked[j] = rng.IntN(tenants)
					var slot int32
					rows[j], _, slot = table.lookupRow(keys[picked[j]], nil)
					noted[keys[picked[j]]] = slot
					rows[j].Version++
				}
				for j, i := range picked {
					if hinted {
						noted[keys[i]] = noted[keys[i]] // putAccounts keeps the slot
						table.rememberAt(keys[i], rows[j], noted[keys[i]])
					} else {
						table.rememberRow(keys[i], rows[j], nil)
					}
				}
				clear(noted)
			}
			b.ReportMetric(float64((benchCPU()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
