package ledger

import (
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The lifecycle benchmarks measure the ledger alone: an in-memory book
// without a journal, ids generated before the timer starts, simulated time
// advancing 1 µs per lifecycle (so every reserve also refills). One op is
// one reserve + start + settle, three commands through Apply; lifecycles/s
// is the figure the performance goal is stated in, and allocs/op counts
// the three commands together (docs/PERFORMANCE.md):
//
//	go test -bench . -benchmem -cpu 1 -run '^$' ./ledger/
//
// Rows are kept as a store keeps them. The headline variants keep every
// reservation, as a store does within its retention window (72 hours by
// default, far longer than any run here). The Retention variant also
// removes them as a store's retention worker does, through the ledger's
// own commands, timed with the rest: each lifecycle retires the
// reservation benchRetention lifecycles older (leaving a tombstone) and
// forgets the tombstone 2*benchRetention older, so its book holds a
// bounded window and the cost of removing is charged.

const benchRetention = 4096

// benchChunk is how many lifecycles run between two untimed pauses that
// generate ids.
const benchChunk = 1 << 16

// benchPolicy limits tokens and requests; the refill keeps up with the
// benchmark's usage so every reserve is admitted.
func benchPolicy(subject string) *Policy {
	p := Policy{
		Key: PolicyKey{Subject: subject, Route: "chat.generate", Region: "eu"},
		Dimensions: []Dimension{
			{Unit: "tokens", Burst: 1 << 40, MaxReservation: 4096, RefillUnits: 1_000_000, RefillInterval: time.Millisecond},
			{Unit: "requests", Burst: 1 << 30, MaxReservation: 1, RefillUnits: 1000, RefillInterval: time.Millisecond},
		},
		HoldTTL: time.Minute,
	}.WithDefaults()
	return &p
}

func benchLifecycles(b *testing.B, subjects int, retention bool) {
	start := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	m := NewMemory()
	m.DiscardJournal = true
	subject := "tenant-0"
	if subjects > 1 {
		subject = AnySubject // one route-wide policy, one account per tenant
	}
	if res := PublishPolicy(m, benchPolicy(subject), start); res.Err != nil {
		b.Fatal(res.Err)
	}
	names := make([]string, subjects)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	// Open every account before timing, as a running ledger would have.
	for i, name := range names {
		warm := Command{Kind: KindReserve, ReservationID: "warm-" + strconv.Itoa(i), RequestDigest: "d",
			Subject: name, Route: "chat.generate", Region: "eu", Units: Amounts{1, 1}}
		if res := Apply(m, &warm, start); res.Err != nil {
			b.Fatal(res.Err)
		}
	}
	now := start.Add(time.Second)
	// Ids are generated outside the timer, a chunk at a time, so neither
	// their formatting nor millions of live id strings (which the garbage
	// collector would scan) are charged to the ledger.
	ids := make([]string, benchChunk)
	operations := make([]string, benchChunk)
	text, ends := make([]byte, 0, 24*benchChunk), make([]int, 0, 2*benchChunk)
	// ring holds the ids of the last 2*benchRetention lifecycles, for
	// the retire and forget commands of the Retention variant.
	var ring [2 * benchRetention]string
	var cpu time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for chunk := 0; chunk < b.N; chunk += benchChunk {
		b.StopTimer()
		n := min(benchChunk, b.N-chunk)
		// Each chunk's ids are cut from one string, so the harness adds one
		// object per chunk, not two per lifecycle, to what the garbage
		// collector charges to the timed loop.
		text, ends = text[:0], ends[:0]
		for i := range n {
			text = strconv.AppendInt(append(text, "rl-"...), int64(chunk+i), 10)
			ends = append(ends, len(text))
			text = strconv.AppendInt(append(text, "op-"...), int64(chunk+i), 10)
			ends = append(ends, len(text))
		}
		all := string(text)
		for i, at := 0, 0; i < n; i++ {
			ids[i], operations[i] = all[at:ends[2*i]], all[ends[2*i]:ends[2*i+1]]
			at = ends[2*i+1]
		}
		cpuBefore := processCPU()
		b.StartTimer()
		for i := range n {
			now = now.Add(time.Microsecond)
			reserve := Command{Kind: KindReserve, ReservationID: ids[i], RequestDigest: "sha256:71a",
				Subject: names[(chunk+i)%subjects], Route: "chat.generate", Region: "eu", Units: Amounts{600, 1}}
			if res := Apply(m, &reserve, now); res.Err != nil {
				b.Fatalf("reserve %d: %v", chunk+i, res.Err)
			}
			started := Command{Kind: KindStart, ReservationID: ids[i], OperationID: operations[i]}
			if res := Apply(m, &started, now); res.Err != nil {
				b.Fatalf("start %d: %v", chunk+i, res.Err)
			}
			settle := Command{Kind: KindSettle, ReservationID: ids[i], OperationID: operations[i], Units: Amounts{200, 1}}
			if res := Apply(m, &settle, now); res.Err != nil || res.Refunded[0] != 400 {
				b.Fatalf("settle %d: %+v", chunk+i, res)
			}
			if !retention {
				continue
			}
			g := chunk + i
			if g >= 2*benchRetention {
				forget := Command{Kind: KindForget, ReservationID: ring[g%len(ring)], Before: now.Add(-2 * benchRetention * time.Microsecond)}
				if res := Apply(m, &forget, now); res.Err != nil {
					b.Fatalf("forget %d: %v", g-2*benchRetention, res.Err)
				}
			}
			ring[g%len(ring)] = ids[i]
			if g >= benchRetention {
				retire := Command{Kind: KindRetire, ReservationID: ring[(g-benchRetention)%len(ring)], Before: now.Add(-benchRetention * time.Microsecond)}
				if res := Apply(m, &retire, now); res.Err != nil {
					b.Fatalf("retire %d: %v", g-benchRetention, res.Err)
				}
			}
		}
		b.StopTimer()
		cpu += processCPU() - cpuBefore
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lifecycles/s")
	// On a shared machine wall time includes waiting for a core; the
	// process's CPU time per lifecycle (user + system, GC included) is what
	// one dedicated core would take.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/cpu.Seconds(), "lifecycles/cpu-s")
}

// processCPU is the CPU time the process has used so far.
func processCPU() time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

// BenchmarkLifecycleHotAccount: every lifecycle on one account, every
// row kept.
func BenchmarkLifecycleHotAccount(b *testing.B) { benchLifecycles(b, 1, false) }

// BenchmarkLifecycle10kAccounts: lifecycles round-robin over 10,000
// subjects under one route-wide policy, every row kept.
func BenchmarkLifecycle10kAccounts(b *testing.B) { benchLifecycles(b, 10_000, false) }

// BenchmarkLifecycleHotAccountRetention: as HotAccount, and each
// lifecycle also retires one finished reservation and forgets one
// tombstone, as retention does.
func BenchmarkLifecycleHotAccountRetention(b *testing.B) { benchLifecycles(b, 1, true) }
