// Command cutheap cuts a statement checkpoint of a data directory's SQLite
// store through engine.CutCheckpoint, as serve's compaction pass does, and
// writes a heap profile (after a GC) when page -at of the new
// checkpoint's accounts reaches the store (the first: the audit is done
// and the cut holds its replays; later ones: while it writes)
// (docs/PERFORMANCE.md, "A million tenants").
//
//	go run ./scripts/cutheap -dir COPY -memprofile heap.pprof -at 1
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

type profiling struct {
	store.Store
	path  string
	at    int // the page to profile at (1: the first)
	pages int
}

func (p *profiling) CheckpointWrite(ctx context.Context, seq int64) (store.CheckpointWriter, error) {
	w, err := p.Store.CheckpointWrite(ctx, seq)
	if err != nil {
		return nil, err
	}
	return &profilingWriter{CheckpointWriter: w, p: p}, nil
}

type profilingWriter struct {
	store.CheckpointWriter
	p *profiling
}

func (w *profilingWriter) Put(ctx context.Context, page []ledger.CheckpointAccount) error {
	if w.p.pages++; w.p.pages == w.p.at {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		fmt.Printf("page %d: live heap %d MB after a GC, heap sys %d MB\n", w.p.pages, m.HeapAlloc>>20, m.HeapSys>>20)
		if w.p.path != "" {
			f, err := os.Create(w.p.path)
			if err == nil {
				_ = pprof.WriteHeapProfile(f)
				f.Close()
			}
		}
	}
	return w.CheckpointWriter.Put(ctx, page)
}

// sampleHeap prints, every d, the live heap (as of the last GC), the
// heap goal, the total allocated and the mapped memory, from runtime/metrics.
func sampleHeap(d time.Duration) {
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"},
		{Name: "/gc/heap/allocs:bytes"}, {Name: "/memory/classes/total:bytes"}}
	start := time.Now()
	profiled := false
	for range time.Tick(d) {
		metrics.Read(samples)
		if path := os.Getenv("CUTHEAP_PEAK_PROFILE"); path != "" && !profiled && samples[0].Value.Uint64() > 300<<20 {
			// The live heap past 300 MB: what holds it.
			profiled = true
			if f, err := os.Create(path); err == nil {
				_ = pprof.WriteHeapProfile(f)
				f.Close()
			}
		}
		fmt.Printf("t=%.0fs live %d MB goal %d MB allocated %d MB mapped %d MB\n", time.Since(start).Seconds(),
			samples[0].Value.Uint64()>>20, samples[1].Value.Uint64()>>20, samples[2].Value.Uint64()>>20, samples[3].Value.Uint64()>>20)
	}
}

func main() {
	dir := flag.String("dir", "", "data directory (a copy: the cut is stored)")
	memprofile := flag.String("memprofile", "", "heap profile at page -at")
	at := flag.Int("at", 1, "the page of the new checkpoint's accounts to profile at (1: the first)")
	sample := flag.Duration("sample", 0, "print the live heap, the heap goal and the bytes allocated so far this often (0: never)")
	flag.Parse()
	if *sample > 0 {
		go sampleHeap(*sample)
	}
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(*dir, "capledger.db"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer st.Close()
	p := &profiling{Store: st, path: *memprofile, at: *at}
	e := engine.New(p, engine.Options{DisableWorkers: true, Compaction: &engine.CompactionOptions{}})
	defer e.Close()
	start := time.Now()
	cp, found, err := e.CutCheckpoint(ctx, time.Now())
	if err != nil || len(found) > 0 || cp == nil {
		fmt.Fprintln(os.Stderr, "cut:", err, found, cp != nil)
		os.Exit(1)
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fmt.Printf("checkpoint %d (%d entries) in %s, total allocated %d MB\n", cp.Seq, cp.Entries, time.Since(start).Round(time.Millisecond), m.TotalAlloc>>20)
}
