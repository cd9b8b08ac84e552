package sqlite

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// fullAccount returns an account whose every field, every dimension's
// every term and every refill cursor is set, to distinct values of both
// signs and up to the int64 range's ends.
func fullAccount() ledger.Account {
	a := ledger.Account{
		Key:        ledger.AccountKey{Subject: "tenant-é", Route: "chat", Region: "eu-west", Generation: math.MaxInt64},
		Dims:       ledger.MaxDimensions,
		EpochStart: time.Unix(0, 1764720000123456789).UTC(),
		Version:    math.MaxUint64,
		Breaches:   -7,
	}
	v := int64(1)
	for d := range ledger.MaxDimensions {
		a.RefilledTo[d] = 1764720000000000000 + int64(d)
		a.HeldElsewhere[d] = math.MaxInt64 - int64(d)
		for _, bs := range []*ledger.Balances{&a.Balances, &a.EpochOpening} {
			for i, term := range balanceTerms(&bs[d]) {
				switch i % 3 {
				case 0:
					*term = v
				case 1:
					*term = -v
				default:
					*term = math.MaxInt64 - v
				}
				v++
			}
		}
	}
	a.Balances[3].Spent = math.MinInt64
	return a
}

// nonzeroFields fails when a field of v (recursively) is its zero value,
// so an Account field added later must be set by fullAccount, and so
// round-tripped by the codec, before this test passes.
func nonzeroFields(t *testing.T, path string, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			if v.Interface().(time.Time).IsZero() {
				t.Errorf("%s is zero", path)
			}
			return
		}
		for i := range v.NumField() {
			nonzeroFields(t, path+"."+v.Type().Field(i).Name, v.Field(i))
		}
	case reflect.Array:
		for i := range v.Len() {
			nonzeroFields(t, fmt.Sprintf("%s[%d]", path, i), v.Index(i))
		}
	default:
		if v.IsZero() {
			t.Errorf("%s is zero", path)
		}
	}
}

// The packed account cache returns every field of an account as it was
// remembered: all dimensions, all terms, the refill cursors, the epoch,
// extreme values; a zero account and a known-absent row, too.
func TestPackedAccountRoundTrip(t *testing.T) {
	full := fullAccount()
	nonzeroFields(t, "Account", reflect.ValueOf(full))
	zero := ledger.Account{Key: ledger.AccountKey{Subject: "", Route: "r", Region: "", Generation: 0}}
	table := newPackedTable(8, accountCodec)
	for _, a := range []ledger.Account{full, zero} {
		table.rememberRow(a.Key, &a, copyRow)
		got, found, _ := table.lookupRow(a.Key, copyRow)
		if !found || got == nil {
			t.Fatalf("%s: not found after remember", a.Key)
		}
		if !reflect.DeepEqual(*got, a) {
			t.Fatalf("round trip changed the account:\n got %+v\nwant %+v", *got, a)
		}
	}
	absent := ledger.AccountKey{Subject: "tenant-é", Route: "chat", Region: "eu-west", Generation: 1}
	table.rememberRow(absent, nil, copyRow)
	if got, found, _ := table.lookupRow(absent, copyRow); !found || got != nil {
		t.Fatalf("absent row: %v %v, want nil, true", got, found)
	}
	// A key that only prefixes a cached one is not it.
	if _, found, _ := table.lookupRow(ledger.AccountKey{Subject: "tenant-é", Route: "chat", Region: "eu-west"}, copyRow); found {
		t.Fatal("an uncached key found")
	}

	currents := newPackedTable(8, currentCodec)
	for _, g := range []uint64{0, 1, math.MaxInt64, math.MaxUint64} {
		k := ledger.PolicyKey{Subject: "s", Route: fmt.Sprint(g)}
		currents.rememberRow(k, &g, copyRow)
		if got, found, _ := currents.lookupRow(k, copyRow); !found || got == nil || *got != g {
			t.Fatalf("current %d read back as %v %v", g, got, found)
		}
	}
}

// A truncated or overlong packed row is an error, never a wrong account.
func TestPackedAccountRejectsDamagedBytes(t *testing.T) {
	a := fullAccount()
	b := accountCodec.appendRow(nil, &a)
	for n := range len(b) {
		if _, err := accountCodec.decodeRow(string(b[:n]), a.Key); err == nil {
			t.Fatalf("%d of %d bytes decoded", n, len(b))
		}
	}
	if _, err := accountCodec.decodeRow(string(b)+"\x00", a.Key); err == nil {
		t.Fatal("a byte past the account decoded")
	}
}

// The packed tables keep clockTable's eviction: bounded, one row at a
// time, never cleared wholesale, hot rows kept through a scan.
func TestPackedTableEvictsColdRowsOnly(t *testing.T) {
	const limit = 100
	table := newPackedTable(limit, accountCodec)
	key := func(i int) ledger.AccountKey {
		return ledger.AccountKey{Subject: fmt.Sprint(i), Route: "r", Generation: 1}
	}
	account := func(i int) *ledger.Account { return &ledger.Account{Key: key(i), Dims: 1, Version: uint64(i + 1000)} }
	hot := []int{-1, -2, -3, -4, -5}
	for _, i := range hot {
		table.rememberRow(key(i), account(i), copyRow)
	}
	for i := range 10 * limit {
		if i%10 == 0 {
			for _, h := range hot {
				if a, ok, _ := table.lookupRow(key(h), copyRow); !ok || a.Version != uint64(h+1000) {
					t.Fatalf("hot row %d evicted or changed after %d scanned rows: %v", h, i, a)
				}
			}
		}
		table.rememberRow(key(i), account(i), copyRow)
		if n := table.len(); n > limit {
			t.Fatalf("%d rows cached, limit %d", n, limit)
		}
		if i >= limit && table.len() != limit {
			t.Fatalf("after %d rows the cache holds %d: it cleared itself", i, table.len())
		}
		if len(table.index) != table.len() {
			t.Fatalf("index %d entries, %d slots", len(table.index), table.len())
		}
	}
	if _, ok, _ := table.lookupRow(key(10*limit-1), copyRow); !ok {
		t.Error("the last row put is not cached")
	}
	if _, ok, _ := table.lookupRow(key(0), copyRow); ok {
		t.Error("the first scanned row is still cached after 10 limits of others")
	}
	if int(table.evictions) != 10*limit-(limit-len(hot)) {
		t.Errorf("%d evictions, want %d", table.evictions, 10*limit-(limit-len(hot)))
	}
	for h, i := range table.index {
		if table.slots[i].hash != h {
			t.Fatalf("index says %x is in slot %d, which holds %x", h, i, table.slots[i].hash)
		}
	}
}

// Two keys with one hash share a slot: each misses while the other holds
// it, and neither ever reads the other's row.
func TestPackedTableHashCollision(t *testing.T) {
	table := newPackedTable(8, accountCodec)
	a, b := fullAccount(), fullAccount()
	// Keys of one length, so a's row would decode as b's.
	b.Key.Generation, b.Version = a.Key.Generation-1, 5
	table.rememberRow(a.Key, &a, copyRow)
	hashB, _, _, _ := table.find(b.Key)
	// Make b's hash point at a's slot, as a collision would.
	hashA, slotA, _, _ := table.find(a.Key)
	table.index[hashB] = slotA
	table.slots[slotA].hash = hashB
	delete(table.index, hashA)
	if row, found, _ := table.lookupRow(b.Key, copyRow); found {
		t.Fatalf("b read a's slot: %+v", row)
	}
	table.rememberRow(b.Key, &b, copyRow)
	if row, found, _ := table.lookupRow(b.Key, copyRow); !found || row.Version != 5 || row.Key != b.Key {
		t.Fatalf("b reads %+v %v", row, found)
	}
	if table.len() != 1 {
		t.Fatalf("%d slots, want b in a's one", table.len())
	}
}

// WarmCache fills the row cache with committed accounts and currents in
// key order until it is full, evicting nothing, and what it cached reads
// back as committed.
func TestWarmCacheFillsUpToTheBound(t *testing.T) {
	ctx := context.Background()
	for _, rows := range []int{16, 1000} {
		s, err := Open(ctx, filepath.Join(t.TempDir(), "warm.db"), WithCacheRows(rows))
		if err != nil {
			t.Fatal(err)
		}
		const accounts = 2*warmChunk + 10
		ch := &store.Changes{}
		for i := range accounts {
			a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("t%05d", i), Route: "r", Region: "g", Generation: 2},
				Dims: 1, Version: uint64(i + 1), EpochStart: time.Unix(1764720000, 0)}
			a.Balances[0].Available = int64(i)
			ch.Accounts = append(ch.Accounts, a)
			ch.Currents = append(ch.Currents, store.Current{Subject: a.Key.SubjectKey(), Generation: 2})
		}
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Write(ctx, ch); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		s.cache.invalidate() // as a server started on the file
		evicted := s.CacheStats().Evictions
		n, err := s.WarmCache(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := min(rows, accounts)
		st := s.CacheStats()
		if n != want || st.Accounts != want || st.Evictions != evicted || s.cache.currents.len() != want {
			t.Fatalf("cache of %d rows: warmed %d, %+v, %d currents; want %d, no evictions", rows, n, st, s.cache.currents.len(), want)
		}
		tx, err = s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			k := ch.Accounts[i].Key
			if !s.cache.accounts.has(k) {
				t.Fatalf("account %d not warmed (key order)", i)
			}
			g, err := tx.AccountCurrentGet(ctx, k.SubjectKey())
			if err != nil || g != 2 {
				t.Fatalf("current of %s: %d %v", k, g, err)
			}
			a, err := tx.AccountGet(ctx, k)
			if err != nil || a.Balances[0].Available != int64(i) || a.Version != uint64(i+1) || !a.EpochStart.Equal(ch.Accounts[i].EpochStart) {
				t.Fatalf("account %d reads %+v %v", i, a, err)
			}
		}
		tx.Rollback(ctx)
		s.Close()
	}
}

// rememberAt writes into the slot lookupRow found only while that slot
// still holds the key: after the key was evicted and its slot refilled,
// after a remove moved it, or after a reset, the key is looked up again,
// so no other key's slot is overwritten and no stale copy stays indexed.
func TestPackedTableRememberAtChecksTheSlot(t *testing.T) {
	const limit = 4
	key := func(i int) ledger.AccountKey {
		return ledger.AccountKey{Subject: fmt.Sprint(i), Route: "r", Generation: 1}
	}
	account := func(i int, version uint64) *ledger.Account {
		return &ledger.Account{Key: key(i), Dims: 1, Version: version}
	}
	// readsAsPut checks that every cached key reads the row last put for
	// it, and the index names exactly the slots.
	readsAsPut := func(t *testing.T, table *packedTable[ledger.AccountKey, ledger.Account], want map[int]uint64) {
		t.Helper()
		if len(table.index) != table.len() {
			t.Fatalf("index %d entries, %d slots", len(table.index), table.len())
		}
		for h, i := range table.index {
			if table.slots[i].hash != h {
				t.Fatalf("index says %x is in slot %d, which holds %x", h, i, table.slots[i].hash)
			}
		}
		for k, version := range want {
			if a, ok, _ := table.lookupRow(key(k), copyRow); ok && (a.Key != key(k) || a.Version != version) {
				t.Fatalf("key %d reads %+v, want version %d", k, a, version)
			}
		}
	}
	cases := map[string]func(table *packedTable[ledger.AccountKey, ledger.Account], want map[int]uint64){
		"kept": func(*packedTable[ledger.AccountKey, ledger.Account], map[int]uint64) {},
		"evicted, then read again elsewhere": func(table *packedTable[ledger.AccountKey, ledger.Account], want map[int]uint64) {
			for i := 1; i <= 3*limit; i++ {
				table.rememberRow(key(i), account(i, uint64(i)), copyRow)
				want[i] = uint64(i)
			}
			if _, ok, _ := table.lookupRow(key(0), copyRow); ok {
				t.Fatal("key 0 not evicted")
			}
			table.rememberRow(key(0), account(0, 1), copyRow)
		},
		"moved by a remove": func(table *packedTable[ledger.AccountKey, ledger.Account], want map[int]uint64) {
			// Key 0 is in slot 0: fill the rest, then move key 3 into it.
			for i := 1; i < limit; i++ {
				table.rememberRow(key(i), account(i, uint64(i)), copyRow)
				want[i] = uint64(i)
			}
			table.remove(0)
			table.rememberRow(key(0), account(0, 1), copyRow)
		},
		"reset": func(table *packedTable[ledger.AccountKey, ledger.Account], want map[int]uint64) {
			table.reset()
			table.rememberRow(key(5), account(5, 5), copyRow)
			want[5] = 5
		},
	}
	for name, between := range cases {
		t.Run(name, func(t *testing.T) {
			table := newPackedTable(limit, accountCodec)
			table.rememberRow(key(0), account(0, 1), copyRow)
			_, _, slot := table.lookupRow(key(0), copyRow)
			if slot == noSlot {
				t.Fatal("key 0 found at no slot")
			}
			want := map[int]uint64{0: 1}
			between(table, want)
			table.rememberAt(key(0), account(0, 2), slot)
			want[0] = 2
			readsAsPut(t, table, want)
			if a, ok, _ := table.lookupRow(key(0), copyRow); !ok || a.Version != 2 {
				t.Fatalf("key 0 reads %+v %v after its update, want version 2", a, ok)
			}
		})
	}
}

// A mask naming a value past the ones a row holds is damage, the first
// such bit included.
func TestPackedIntsRejectAMaskPastItsValues(t *testing.T) {
	var vs [4]int64
	r := packedReader{b: string(binary.AppendUvarint(nil, 1<<len(vs)))}
	r.ints(vs[:])
	if r.err == nil {
		t.Fatalf("mask bit %d of %d values decoded", len(vs), len(vs))
	}
	r = packedReader{b: string(binary.AppendVarint(binary.AppendUvarint(nil, 1<<(len(vs)-1)), 7))}
	r.ints(vs[:])
	if r.err != nil || vs[len(vs)-1] != 7 {
		t.Fatalf("the last value's bit: %v, %v", vs, r.err)
	}
}
