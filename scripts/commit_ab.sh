#!/usr/bin/env bash
# commit_ab.sh: store/sqlite's BenchmarkCommitLifecycles at several git
# revisions, interleaved: each round runs every revision's binary in turn,
# so load from elsewhere hits all alike. Prints every run, then per
# sub-benchmark and revision the medians over rounds of CPU per lifecycle
# and WAL pages per transaction, and their ratio to the previous revision
# (lower is better for both).
#
#   ROUNDS=3 BENCHTIME=150x ACCOUNTS=1000000 scripts/commit_ab.sh REV1 REV2 [REV...]
#
# Every revision runs the benchmark file of BENCH_FROM (default the last
# revision), so a revision older than a fix to the benchmark measures the
# same thing. The binaries are built first; the runs hold /work/bench.lock (LOCK) when
# it exists. Filled files are kept in CACHE (default
# /tmp/capledger-commit-ab), one per schema version and account count: the
# first run that needs one fills it (a minute for a million accounts).
set -euo pipefail
REVS=("$@")
LOCK=${LOCK:-/work/bench.lock}
ROUNDS=${ROUNDS:-3} BENCHTIME=${BENCHTIME:-150x} ACCOUNTS=${ACCOUNTS:-1000000}
BENCH=${BENCH:-CommitLifecycles}
CACHE=${CACHE:-/tmp/capledger-commit-ab}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE"
for rev in "${REVS[@]}"; do
	mkdir -p "$WORK/$rev/src"
	git -C "$REPO" archive "$rev" | tar -x -C "$WORK/$rev/src"
	# The benchmark as of BENCH_FROM runs at every revision.
	git -C "$REPO" show "${BENCH_FROM:-${REVS[-1]}}:store/sqlite/commit_bench_test.go" >"$WORK/$rev/src/store/sqlite/commit_bench_test.go"
	(cd "$WORK/$rev/src" && go test -c -o "$WORK/$rev/sqlite.test" ./store/sqlite)
done
if [[ -e $LOCK ]]; then
	exec 9>>"$LOCK"
	flock 9
fi
for round in $(seq "$ROUNDS"); do
	for rev in "${REVS[@]}"; do
		echo "# round $round $rev load $(cut -d' ' -f1-3 /proc/loadavg)"
		(cd "$WORK/$rev/src/store/sqlite" && CAPLEDGER_BENCH_ACCOUNTS=$ACCOUNTS CAPLEDGER_BENCH_CACHE=$CACHE \
			"$WORK/$rev/sqlite.test" -test.run '^$' -test.bench "$BENCH" -test.benchtime "$BENCHTIME") |
			grep '^Benchmark' | sed "s/^/$rev /" | tee -a "$WORK/runs"
	done
done
exec 9>&-
awk -v revs="${REVS[*]}" '
function median(list,   n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
	name = $2; sub(/-[0-9]+$/, "", name)
	for (i = 5; i < NF; i++) {
		if ($(i + 1) == "cpu-µs/lifecycle") cpu[$1, name] = cpu[$1, name] " " $i
		if ($(i + 1) == "wal-pages/tx") pages[$1, name] = pages[$1, name] " " $i
	}
	names[name] = 1
}
END {
	nr = split(revs, r, " ")
	printf "%-48s %-12s %10s %7s %9s %7s\n", "benchmark", "revision", "µs/lc", "ratio", "pages/tx", "ratio"
	for (n in names) for (k = 1; k <= nr; k++) {
		c = median(cpu[r[k], n]); p = median(pages[r[k], n])
		if (k == 1) printf "%-48s %-12s %10.1f %7s %9.1f %7s\n", n, r[k], c, "", p, ""
		else printf "%-48s %-12s %10.1f %6.2fx %9.1f %6.2fx\n", n, r[k], c, c / pc, p, p / pp
		pc = c; pp = p
	}
}' "$WORK/runs"
