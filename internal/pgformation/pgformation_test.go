package pgformation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/internal/pgformation"
)

// The formation comes up with one primary and synchronous-quorum standbys;
// a row committed on the primary survives a kill -9 of the primary's whole
// process tree, the multi-host DSN reaches the promoted standby, the
// killed node rejoins as a standby (the promoted one primary on a new
// timeline), and teardown leaves no process behind.
func TestFormationFailsOverAndRejoins(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a four-process pg_auto_failover formation")
	}
	start := time.Now()
	f := pgformation.Start(t, 3)
	t.Logf("formation up in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	primary, err := f.Primary(ctx)
	if err != nil || primary == nil {
		t.Fatalf("primary: %v %v", primary, err)
	}
	timeline, err := primary.Timeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, ctx, f.DSN())
	var port int
	var syncNames, syncCommit string
	if err := conn.QueryRow(ctx, `SELECT inet_server_port(), current_setting('synchronous_standby_names'),
		current_setting('synchronous_commit')`).Scan(&port, &syncNames, &syncCommit); err != nil {
		t.Fatal(err)
	}
	if port != primary.Port {
		t.Errorf("multi-host DSN reached port %d, the monitor's primary is %d", port, primary.Port)
	}
	if !strings.HasPrefix(syncNames, "ANY 1 (") || syncCommit != "on" {
		t.Errorf("primary replicates with synchronous_standby_names %q, synchronous_commit %q; want ANY 1 (...), on", syncNames, syncCommit)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE acked (id int PRIMARY KEY); INSERT INTO acked VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	killed := primary.Kill()
	if killed < 3 {
		t.Errorf("killed %d processes of the primary's tree; want pg_autoctl, its services, the postmaster and backends", killed)
	}
	if _, err := pgx.Connect(ctx, primary.DSN()); err == nil {
		t.Fatal("the killed primary still accepts connections")
	}
	died := time.Now()
	var next *pgx.Conn
	for next == nil {
		if c, err := pgx.Connect(ctx, f.DSN()); err == nil {
			// A standby being promoted may accept the connection before
			// it takes writes: read-write validation checks that.
			next = c
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no primary after the kill: %v", ctx.Err())
		}
		time.Sleep(100 * time.Millisecond)
	}
	failover := time.Since(died)
	defer next.Close(ctx)
	var n int
	if err := next.QueryRow(ctx, `SELECT count(*) FROM acked`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the committed row after failover: %d rows, %v", n, err)
	}
	if err := next.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port); err != nil || port == primary.Port {
		t.Fatalf("after failover the DSN reached port %d (%v); the old primary was %d", port, err, primary.Port)
	}

	primary.Rejoin()
	rejoinStart := time.Now()
	// pg_autoctl run on a node killed with -9 has, on a loaded machine,
	// stayed reported primary, assigned demoted, for minutes (seen twice
	// in CI, with nothing in its output to say why); an operator would
	// restart it. So does the test, once, after two minutes, saying so.
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	err = f.WaitHealthy(wctx)
	wcancel()
	if err != nil {
		t.Logf("not healthy 2 minutes after the rejoin (%v); restarting %s's pg_autoctl\n%s", err, primary.Name, f.Logs())
		primary.Kill()
		primary.Rejoin()
		if err := f.WaitHealthy(ctx); err != nil {
			t.Fatalf("not healthy after a second rejoin: %v\n%s", err, f.Logs())
		}
	}
	t.Logf("failover (kill to first read-write connection) %s, rejoin %s",
		failover.Round(time.Millisecond), time.Since(rejoinStart).Round(time.Millisecond))
	after, afterTimeline, err := f.TookOver(ctx, primary, timeline)
	if err != nil || after == primary {
		t.Fatalf("after the failover: TookOver returned %v (timeline %d), %v; want another node than %s", after != nil && after != primary, afterTimeline, err, primary.Name)
	}
	t.Logf("primary %s (timeline %d) -> %s (timeline %d)", primary.Name, timeline, after.Name, afterTimeline)
	states, err := f.States(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Port == primary.Port && s.Reported != "secondary" {
			t.Errorf("the old primary rejoined as %s, want secondary", s.Reported)
		}
	}
}

func connect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	return conn
}
