#!/usr/bin/env bash
# commit_ab.sh: store/sqlite's BenchmarkCommitLifecycles at two git
# revisions, interleaved: each round runs the old binary, then the new one,
# so load from elsewhere hits both alike. Prints every run, then per
# sub-benchmark the medians over rounds and new/old for CPU per lifecycle
# and WAL pages per transaction (lower is better for both).
#
#   ROUNDS=3 BENCHTIME=150x ACCOUNTS=1000000 scripts/commit_ab.sh OLD_REV NEW_REV
#
# Filled files are kept in CACHE (default /tmp/capledger-commit-ab), one per
# schema version and account count: the first run of a revision fills it.
set -euo pipefail
OLD=$1 NEW=$2
ROUNDS=${ROUNDS:-3} BENCHTIME=${BENCHTIME:-150x} ACCOUNTS=${ACCOUNTS:-1000000}
BENCH=${BENCH:-CommitLifecycles}
CACHE=${CACHE:-/tmp/capledger-commit-ab}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE"
for rev in "$OLD" "$NEW"; do
	mkdir -p "$WORK/$rev/src"
	git -C "$REPO" archive "$rev" | tar -x -C "$WORK/$rev/src"
	(cd "$WORK/$rev/src" && go test -c -o "$WORK/$rev/sqlite.test" ./store/sqlite)
done
for round in $(seq "$ROUNDS"); do
	for rev in "$OLD" "$NEW"; do
		echo "# round $round $rev load $(cut -d' ' -f1-3 /proc/loadavg)"
		(cd "$WORK/$rev/src/store/sqlite" && CAPLEDGER_BENCH_ACCOUNTS=$ACCOUNTS CAPLEDGER_BENCH_CACHE=$CACHE \
			"$WORK/$rev/sqlite.test" -test.run '^$' -test.bench "$BENCH" -test.benchtime "$BENCHTIME") |
			grep '^Benchmark' | sed "s/^/$rev /" | tee -a "$WORK/runs"
	done
done
awk -v old="$OLD" -v new="$NEW" '
function median(list,   n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
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
	printf "%-50s %10s %10s %7s %9s %9s %7s\n", "benchmark", "old µs/lc", "new µs/lc", "ratio", "old pg/tx", "new pg/tx", "ratio"
	for (n in names) {
		co = median(cpu[old, n]); cn = median(cpu[new, n]); po = median(pages[old, n]); pn = median(pages[new, n])
		printf "%-50s %10.1f %10.1f %6.2fx %9.1f %9.1f %6.2fx\n", n, co, cn, cn / co, po, pn, pn / po
	}
}' "$WORK/runs" | sort
