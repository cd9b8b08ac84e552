#!/usr/bin/env bash
# retention-bench.sh: reserve throughput and latency while the retention
# worker removes rows, against the same run without retention, and against
# a baseline binary (docs/PERFORMANCE.md, "Bounded history").
#
# Each variant gets a fresh SQLite data directory and a server; a
# background lifecycle load (reserve, start, settle; concurrency 4) keeps
# producing finished reservations, and after PREFILL seconds a measured
# reserve bench (concurrency 16, MEASURE seconds) runs beside it. In "on",
# retention removes everything finished more than 10 s ago, every 2 s:
# the worker runs for the whole measurement. Variants are interleaved,
# ROUNDS times.
#
# "on+compaction" also cuts a statement checkpoint every 10 s (checked
# every 2 s) and deletes the journal it summarises.
#
# Usage: scripts/retention-bench.sh NEW_BINARY [BASELINE_BINARY]
# Environment: ROUNDS (2), PREFILL (30), MEASURE (30), ADDR (127.0.0.1:7392),
# BASE_FLAGS (serve flags of the baseline, none by default: e.g. the "on"
# flags, to compare the retention worker of two binaries).
set -euo pipefail
new=$1
base=${2:-}
rounds=${ROUNDS:-2}
prefill=${PREFILL:-30}
measure=${MEASURE:-30}
addr=${ADDR:-127.0.0.1:7392}
run() { # name binary serve-flags...
	local name=$1 bin=$2
	shift 2
	local dir
	dir=$(mktemp -d)
	"$bin" serve --addr "$addr" --data-dir "$dir" --log-level warn "$@" >"$dir.log" 2>&1 &
	local server=$!
	for _ in $(seq 50); do curl -fs "http://$addr/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
	"$bin" bench --addr "http://$addr" --mode lifecycle --route bench.lifecycle --concurrency 4 \
		--duration "$((prefill + measure + 5))s" --warmup 0s --progress=false >"$dir.lifecycle" 2>&1 &
	local load=$!
	sleep "$prefill"
	"$new" bench --addr "http://$addr" --mode reserve --concurrency 16 --duration "${measure}s" \
		--warmup 1s --progress=false >"$dir.reserve" 2>&1
	wait $load || true
	local ops p99 lops
	ops=$(awk '$1=="ops/s" {print $2}' "$dir.reserve")
	p99=$(awk '$1=="p99" {print $2}' "$dir.reserve")
	lops=$(awk '$1=="ops/s" {print $2}' "$dir.lifecycle")
	echo "$name reserve_ops/s=$ops reserve_p99_ms=$p99 lifecycle_ops/s=$lops data_dir=$(du -sb "$dir" | cut -f1) load=$(cut -d' ' -f1 /proc/loadavg)"
	kill $server
	wait $server 2>/dev/null || true
	rm -rf "$dir" "$dir".*
}
for r in $(seq "$rounds"); do
	# shellcheck disable=SC2086
	[[ -n "$base" ]] && run "baseline" "$base" ${BASE_FLAGS:-}
	run "off" "$new" --retention 0 --compaction 0
	run "on" "$new" --retention 10s --tombstone-retention 20s --retention-interval 2s --compaction 0
	run "on+compaction" "$new" --retention 10s --tombstone-retention 20s --retention-interval 2s \
		--compaction 10s --compaction-interval 2s
done
