#!/usr/bin/env bash
# retention-bench.sh: reserve throughput, p99 and server CPU per command
# while maintenance runs beside admission, against the same run without
# it (docs/PERFORMANCE.md, "Bounded history").
#
# Each run gets a fresh SQLite data directory and a server; a background
# lifecycle load (reserve, start, settle; concurrency 4) keeps producing
# finished reservations, and after PREFILL seconds a measured reserve
# bench (concurrency 16, MEASURE seconds) runs beside it. Variants:
#   off         no retention, no compaction, no audit
#   retention   retention removes everything finished more than 10 s ago,
#               every 2 s: the worker runs for the whole measurement
#   compaction  retention as above, and a statement checkpoint cut every
#               10 s (checked every 2 s) with the journal it summarises
#               deleted
#   audit       no retention; full audits back to back (capledger audit)
#               for the whole measurement
#   baseline-retention, baseline-compaction, baseline-audit
#               that variant on BASELINE_BINARY's server (name them in
#               VARIANTS, e.g. VARIANTS="off audit baseline-audit")
# With SEED set (a data directory, e.g. made by
#   go run ./scripts/auditsize -n 300000 -checkpoint-every 300000 -phases none -dir SEED
# ), every run starts from a copy of it: then "retention" removes its
# finished reservations (they finished long ago) while the measurement
# runs, a pass with a real backlog, and one "audit" reads all of them.
# Variants are interleaved, ROUNDS times, each round in a rotated order.
# Every run prints one line: reserve ops/s, reserve p99, and server CPU
# per call (the server's user + system time over the measurement divided
# by the reserves and lifecycle calls answered in it: the load-insensitive
# figure) and the largest size the WAL file reached during the
# measurement, then the retention worker's counters from /statusz. The end
# prints, per variant, the median and the range over the rounds of its
# ratio to "off" in the same round: on a shared machine the load drifts
# between rounds by more than the variants differ.
#
# Usage: scripts/retention-bench.sh BINARY [BASELINE_BINARY]
# Environment: SEED, ROUNDS (4), PREFILL (10), MEASURE (15), ADDR
# (127.0.0.1:7392), VARIANTS ("off retention compaction audit"),
# SERVE_FLAGS (added to every server, e.g. --maintenance-share 1),
# BASE_FLAGS (serve flags of the baseline binary's run, named
# "baseline" and added when VARIANTS is not set; none by default).
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
bin=$1
base=${2:-}
rounds=${ROUNDS:-4}
prefill=${PREFILL:-10}
measure=${MEASURE:-15}
addr=${ADDR:-127.0.0.1:7392}
read -r -a variants <<<"${VARIANTS:-off retention compaction audit}"
[[ -n "$base" && -z ${VARIANTS:-} ]] && variants+=(baseline)
tick=$(getconf CLK_TCK)
results=$(mktemp)

# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
pids=()
trap 'serve_stop; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -f "$results"' EXIT

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() { # variant
	local name=$1 b=$bin flags=(--retention 0 --compaction 0) what=$1
	if [[ $name == baseline-* ]]; then
		b=$base what=${name#baseline-}
	fi
	case $what in
	retention) flags=(--retention 10s --tombstone-retention 20s --retention-interval 2s --compaction 0) ;;
	compaction) flags=(--retention 10s --tombstone-retention 20s --retention-interval 2s --compaction 10s --compaction-interval 2s) ;;
	baseline) b=$base; read -r -a flags <<<"${BASE_FLAGS:-}" ;;
	esac
	local dir
	dir=$(mktemp -d)
	[[ -n ${SEED:-} ]] && cp -r "$SEED"/. "$dir"/
	# shellcheck disable=SC2086
	serve_start "$addr" "$dir.log" "$b" --data-dir "$dir" --log-level warn "${flags[@]}" ${SERVE_FLAGS:-}
	local server=$SERVE_PID
	pids=()
	"$bin" bench --addr "http://$addr" --mode lifecycle --route bench.lifecycle --concurrency 4 \
		--duration "$((prefill + measure + 3))s" --warmup 0s --progress=false >"$dir.lifecycle" 2>&1 &
	local load=$!
	pids+=("$load")
	sleep "$prefill"
	local auditor=
	if [[ $what == audit ]]; then
		(while :; do "$bin" audit --addr "http://$addr" >>"$dir.audits" 2>&1 || true; echo . >>"$dir.count"; done) &
		auditor=$!
		pids+=("$auditor")
	fi
	# The largest the WAL grew during the measurement, sampled every 0.2 s.
	(max=0; while :; do
		sz=$(stat -c %s "$dir/capledger.db-wal" 2>/dev/null || echo 0)
		((sz > max)) && max=$sz && echo "$max" >"$dir.walmax"
		sleep 0.2
	done) &
	local sampler=$!
	pids+=("$sampler")
	local cpu0 t0 cpu1 t1
	cpu0=$(ticks $server)
	t0=$(date +%s.%N)
	"$bin" bench --addr "http://$addr" --mode reserve --concurrency 16 --duration "${measure}s" \
		--warmup 0s --progress=false >"$dir.reserve" 2>&1
	cpu1=$(ticks $server)
	t1=$(date +%s.%N)
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	if [[ -n $auditor ]]; then
		kill "$auditor" 2>/dev/null || true
		wait "$auditor" 2>/dev/null || true
	fi
	wait $load || true
	local ops p99 lcalls audits
	ops=$(awk '$1=="ops/s" {print $2}' "$dir.reserve")
	p99=$(awk '$1=="p99" {print $2}' "$dir.reserve")
	lcalls=$(awk '$1=="calls/s" {print $2}' "$dir.lifecycle")
	audits=$( [[ -f $dir.count ]] && wc -l <"$dir.count" || echo 0)
	local walmax
	walmax=$( [[ -f $dir.walmax ]] && cat "$dir.walmax" || echo 0)
	local line
	line=$(awk -v n="$name" -v ops="$ops" -v p99="$p99" -v lc="$lcalls" -v c0="$cpu0" -v c1="$cpu1" \
		-v t0="$t0" -v t1="$t1" -v tick="$tick" -v a="$audits" -v wal="$walmax" -v la="$(cut -d" " -f1 /proc/loadavg)" 'BEGIN {
		secs = t1 - t0; calls = (ops + lc) * secs; cpu = (c1 - c0) / tick
		printf "%s reserve_ops/s=%.0f reserve_p99_ms=%s lifecycle_calls/s=%.0f server_cpu_us/call=%.1f audits=%d wal_max_mb=%.1f load=%s\n",
			n, ops, p99, lc, 1e6 * cpu / calls, a, wal / 1048576, la }')
	echo "$line"
	echo "$line" >>"$results"
	curl -fs "http://$addr/statusz" | tr -d ' \n' | grep -o '"retention":{[^}]*}' || true
	serve_stop "$server"
	pids=()
	rm -rf "$dir" "$dir".*
}

for r in $(seq "$rounds"); do
	n=${#variants[@]}
	for i in $(seq 0 $((n - 1))); do
		run "${variants[$(((i + r) % n))]}"
	done
done

# Each run's figures divided by those of "off" in the same round, then
# the median and range of those ratios over the rounds.
echo "# per round, variant / off of the same round: median [min-max] over $rounds rounds"
awk '{ c[$1]++; print c[$1], $0 }' "$results" | awk '
function median(arr, n,    i, j, t) {
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (arr[j] < arr[i]) { t = arr[i]; arr[i] = arr[j]; arr[j] = t }
	return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2
}
{
	round = $1; name = $2
	for (i = 3; i <= NF; i++) { split($i, kv, "="); v[round, name, kv[1]] = kv[2] }
	names[name] = 1; rounds[round] = 1
}
END {
	split("reserve_ops/s reserve_p99_ms server_cpu_us/call", keys, " ")
	for (name in names) {
		if (name == "off") continue
		line = name
		for (k = 1; k <= 3; k++) {
			n = 0; delete r
			for (round in rounds) if ((round, name, keys[k]) in v && v[round, "off", keys[k]] > 0) r[++n] = v[round, name, keys[k]] / v[round, "off", keys[k]]
			if (n == 0) continue
			m = median(r, n)
			line = line sprintf(" %s %.2fx [%.2f-%.2f]", keys[k], m, r[1], r[n])
		}
		print line " (" n " rounds)"
	}
}
'
