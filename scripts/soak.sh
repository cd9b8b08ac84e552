#!/usr/bin/env bash
# soak.sh: run a capledger server with a short retention window under a
# steady lifecycle load (reserve, start, settle) and sample the data
# directory's size and the server's RSS, to show both flat once retention
# keeps up (docs/PERFORMANCE.md, "Bounded history").
#
# Usage: scripts/soak.sh [DURATION_SECONDS] [RETENTION] [CONCURRENCY]
#   defaults: 1800 (30 minutes), 2m, 16
# The server cuts a statement checkpoint (and deletes the journal before
# it) every RETENTION too: with serve's default of 1h, a shorter soak would
# measure only the journal growing until its first checkpoint.
# Environment: CAPLEDGER (binary, default: go build to a temporary file),
#   SOAK_DIR (data directory, default a new temporary one), SAMPLE (seconds
#   between samples, default 30), ADDR (default 127.0.0.1:7391), TOMBSTONES
#   (--tombstone-retention, default RETENTION: rows retired then are
#   already past it and leave no tombstone; longer exercises forgetting),
#   RATE (lifecycles a second, `bench --rate`: a steady load, the same
#   whatever else the machine runs; default unset, a closed loop whose
#   rate follows the machine's load, and with it the window's rows).
# Prints one line per sample (elapsed s, data dir bytes, RSS KiB, WAL
# bytes) and, at the end, the growth over the last half of the run.
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
duration=${1:-1800}
retention=${2:-2m}
concurrency=${3:-16}
sample=${SAMPLE:-30}
addr=${ADDR:-127.0.0.1:7391}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CAPLEDGER:-}
if [[ -z "$bin" ]]; then
	bin=$(mktemp -d)/capledger
	(cd "$root" && go build -o "$bin" ./cmd/capledger)
fi
dir=${SOAK_DIR:-$(mktemp -d)}
log=$dir.serve.log
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
load=
trap '[[ -z $load ]] || kill "$load" 2>/dev/null || true; serve_stop' EXIT
serve_start "$addr" "$log" "$bin" --data-dir "$dir" --retention "$retention" \
	--tombstone-retention "${TOMBSTONES:-$retention}" --compaction "$retention" \
	--compaction-interval 30s --log-level warn
server=$SERVE_PID
"$bin" bench --addr "http://$addr" --mode lifecycle --concurrency "$concurrency" \
	--duration "${duration}s" --warmup 0s --progress=false ${RATE:+--rate "$RATE"} >"$dir.bench.txt" 2>&1 &
load=$!
echo "# soak: ${duration}s, retention $retention, concurrency $concurrency, rate ${RATE:-closed loop}, data dir $dir"
echo "# elapsed_s data_dir_bytes rss_kib wal_bytes"
samples=()
start=$(date +%s)
while kill -0 $load 2>/dev/null; do
	sleep "$sample"
	now=$(( $(date +%s) - start ))
	bytes=$(du -sb "$dir" | cut -f1)
	rss=$(awk '/VmRSS/ {print $2}' /proc/$server/status)
	wal=$(stat -c %s "$dir/capledger.db-wal" 2>/dev/null || echo 0)
	echo "$now $bytes $rss $wal"
	samples+=("$now $bytes $rss $wal")
done
cat "$dir.bench.txt"
n=${#samples[@]}
if (( n >= 4 )); then
	mid=${samples[$((n / 2))]}
	last=${samples[$((n - 1))]}
	awk -v a="$mid" -v b="$last" 'BEGIN {
		split(a, x, " "); split(b, y, " ");
		printf "# last half (%ds -> %ds): data dir %d -> %d bytes (%+.1f%%), RSS %d -> %d KiB (%+.1f%%); without the WAL (bounded by its size limit, its size at a sample is chance) %d -> %d bytes (%+.1f%%)\n",
			x[1], y[1], x[2], y[2], 100 * (y[2] - x[2]) / x[2], x[3], y[3], 100 * (y[3] - x[3]) / x[3],
			x[2] - x[4], y[2] - y[4], 100 * ((y[2] - y[4]) - (x[2] - x[4])) / (x[2] - x[4]) }'
fi
