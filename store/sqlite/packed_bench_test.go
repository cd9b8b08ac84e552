package sqlite

import (
	"fmt"
	"math/rand/v2"
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
