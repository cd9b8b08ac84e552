package postgres_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// A PgBouncer refuses a startup parameter it is not told to ignore
// (SQLSTATE 08P01, "unsupported startup parameter: NAME"): a
// configuration error no retry changes. Open, OpenReadOnly and Migrate
// returned it as store.ErrUnavailable, so `capledger serve` and `migrate`
// exited 5 ("cannot be reached: retry later", OPERATIONS.md) and a
// supervisor retried for ever; they exit 1 naming the parameter and the
// fix, as for refused credentials.
func TestStartupParameterRefusedIsNoOutage(t *testing.T) {
	// statement_timeout in the DSN goes as a startup parameter; the test's
	// PgBouncer ignores only the store's own.
	dsn := pgbouncerSchema(t, "") + "&default_query_exec_mode=exec&statement_timeout=60000"
	ctx := context.Background()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s behind a PgBouncer refusing statement_timeout succeeded", what)
		}
		if errors.Is(err, store.ErrUnavailable) || !errors.Is(err, postgres.ErrStartupParameterRefused) ||
			!strings.Contains(err.Error(), "unsupported startup parameter") || !strings.Contains(err.Error(), "ignore_startup_parameters") {
			t.Fatalf("%s: %v; want ErrStartupParameterRefused (not ErrUnavailable) naming the parameter and ignore_startup_parameters", what, err)
		}
	}
	s, err := postgres.Open(ctx, dsn)
	if err == nil {
		s.Close()
	}
	check("Open", err)
	s, err = postgres.OpenReadOnly(ctx, dsn)
	if err == nil {
		s.Close()
	}
	check("OpenReadOnly", err)
	_, err = postgres.Migrate(ctx, dsn)
	check("Migrate", err)

	bin := replicatest.BuildCapledger(t)
	for _, args := range [][]string{
		{"migrate", "--store", dsn},
		{"serve", "--addr", replicatest.FreeAddr(t), "--store", dsn, "--data-dir", t.TempDir()},
	} {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		cmd := exec.CommandContext(cctx, bin, args...)
		childproc.DieWithParent(cmd)
		out, err := cmd.CombinedOutput()
		cancel()
		t.Logf("capledger %s: %s", args[0], out)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "unsupported startup parameter") {
			t.Fatalf("capledger %s: %v, want exit 1 naming the refused parameter:\n%s", args[0], err, out)
		}
	}
}
