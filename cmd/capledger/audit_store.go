package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/open"
)

// auditStore runs `capledger audit --data-dir/--store`: the server's
// audit (engine.AuditWith, the path AuditService.StreamAudit takes) on
// the store opened read-only, without a server, its report printed as
// the server's. The engine runs no workers: nothing is written.
func auditStore(ctx context.Context, e *env, spec, dataDir string, since, draw bool) error {
	st, err := open.OpenReadOnly(ctx, spec, dataDir)
	if err != nil {
		return storeError(err)
	}
	defer st.Close()
	eng := engine.New(st, engine.Options{DisableWorkers: true})
	defer eng.Close()
	var (
		mu    sync.Mutex
		last  time.Time
		drawn bool
	)
	opts := engine.AuditOptions{SinceCheckpoint: since}
	if draw {
		opts.Progress = func(p engine.AuditProgress) {
			mu.Lock()
			defer mu.Unlock()
			// As often as a server's stream sends it, and the end.
			if !p.Done && time.Since(last) < auditRedrawEvery {
				return
			}
			last = time.Now()
			drawProgress(e.stderr, p.Fraction, p.Rows)
			drawn = true
		}
	}
	found, err := eng.AuditWith(ctx, opts)
	if drawn {
		fmt.Fprintln(e.stderr)
	}
	if err != nil {
		// The engine's error begins "audit: ", which the command's name
		// before it says already ("capledger audit: ").
		return storeError(withoutPrefix(err, "audit: "))
	}
	return printAuditReport(e.stdout, server.AuditReport(found, time.Now()))
}

// withoutPrefix returns err with prefix dropped from the front of its
// message (err itself when its message does not begin with it); the
// result still unwraps to err, so errors.Is sees what err wraps.
func withoutPrefix(err error, prefix string) error {
	msg, ok := strings.CutPrefix(err.Error(), prefix)
	if !ok {
		return err
	}
	return trimmedError{msg: msg, err: err}
}

// trimmedError is an error shown as msg that unwraps to err.
type trimmedError struct {
	msg string
	err error
}

func (e trimmedError) Error() string { return e.msg }
func (e trimmedError) Unwrap() error { return e.err }

// auditRedrawEvery is how often a store's audit redraws its progress bar.
const auditRedrawEvery = 200 * time.Millisecond

// flagGiven reports whether name was set on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
