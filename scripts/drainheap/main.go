// Command drainheap runs, in a process of its own, the passes of serve's
// workers that read every policy of a data directory's SQLite store: the
// drain pass after a policy change (engine.Core.DrainsDue) and a new
// epoch leader's first pass (engine.Core.EpochsDue), and prints what each
// found and took; run it under /usr/bin/time for its maximum RSS
// (docs/PERFORMANCE.md, "A million tenants").
//
//	go run ./scripts/drainheap -dir COPY -pass drain
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"path/filepath"
	"runtime"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/store/sqlite"
)

func main() {
	dir := flag.String("dir", "", "data directory (a copy: nothing is committed, but SQLite may write its WAL)")
	pass := flag.String("pass", "drain", "drain or epoch")
	flag.Parse()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(*dir, "capledger.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	core := engine.NewCore(st)
	started := time.Now()
	var found int
	switch *pass {
	case "drain":
		cmds, err := core.DrainsDue(ctx)
		if err != nil {
			log.Fatal(err)
		}
		found = len(cmds)
	case "epoch":
		cmds, err := core.EpochsDue(ctx, time.Now())
		if err != nil {
			log.Fatal(err)
		}
		found = len(cmds)
	default:
		log.Fatalf("-pass %q: want drain or epoch", *pass)
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fmt.Printf("%s pass: %d commands in %s, %d MB allocated\n", *pass, found, time.Since(started).Round(time.Millisecond), m.TotalAlloc>>20)
}
