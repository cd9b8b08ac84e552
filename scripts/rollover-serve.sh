#!/bin/bash
# scripts/rollover-serve.sh BIN SEED WORK: the epoch rollover of every
# account end to end. One `BIN serve --retention 0 --compaction 0` on a copy
# of SEED (a data directory made by `bench --subjects 1000000
# --epoch-length 24h`; never served in place) in WORK/data, its RESERVED
# holds pushed a week out (no expiry runs) and its policies'
# epoch_length_ns set with sqlite3 so that every epoch that began at 00:00
# UTC ends LEAD (default 59) seconds after the holds' UPDATE; then windows
# of DURATION (default 15s) of `bench --subjects 1000000 --concurrency 64`:
# a warmup, two inside the epoch, three from 2 s past its end. Each bench
# draws a new --seed, so each rollover window reserves mostly on accounts
# whose epoch is still to close (a window reaches 3-9 % of 1M, the paced
# epoch worker closes 1-6 %): every rollover window measures closes inline.
# The epoch worker passes when serve starts and every minute after (its
# watch does not see this epoch end: the epoch does not end at a multiple
# of its length, as real ones do), so with LEAD 59 its second pass starts
# 1-2 s after the end, about when the watch would start it, and closes
# accounts through the rollover windows (LEAD=62 put that pass before the
# end in one of two rounds, and the next one after the windows). Prints
# per window reserves/s, p99, server CPU per reserve (/proc), the workers'
# commands (/metrics), RSS and load, then each rollover window's p99 over
# the mean of the outside windows'. With PPROF_PORT, serve listens for profiles there
# and a CPU profile of the second outside and the first rollover window is
# written to WORK/outside.pprof and WORK/rollover.pprof. With RATE, each
# bench paces its callers to RATE reserves a second (an open schedule)
# instead of running them flat out. With SAMPLE, WORK/samples gets a line
# every half second from the start: the time, serve's CPU ticks, the WAL's
# bytes, and the commits' count and seconds (/metrics capledger_commit_seconds).
# Run it under `flock /work/bench.lock`.
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -u
BIN=$1; SRC=$2; WORK=$3; PORT=${PORT:-27461}; DURATION=${DURATION:-15s}; LEAD=${LEAD:-59}; PPROF_PORT=${PPROF_PORT:-}
rm -rf "$WORK/data"; cp -r "$SRC" "$WORK/data"
# About 10 s at 1M; LEAD counts from after it.
sqlite3 "$WORK/data/capledger.db" "PRAGMA busy_timeout=5000;
	UPDATE reservations SET expires_at = expires_at + 604800000000000, due_at = due_at + 604800000000000 WHERE state = 1;" >/dev/null
start=$(date +%s)
end=$((start + LEAD))
midnight=$(( (start / 86400) * 86400 ))
len=$((end - midnight))
sqlite3 "$WORK/data/capledger.db" "PRAGMA busy_timeout=5000; UPDATE policies SET epoch_length_ns = ${len}000000000;" >/dev/null
echo "# $(basename "$BIN") epoch ends $(date -u -d @$end +%T) (length ${len}s); $(uptime)"
pprof=()
[[ -n $PPROF_PORT ]] && pprof=(--pprof-addr "127.0.0.1:$PPROF_PORT")
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
trap 'serve_stop; wait 2>/dev/null' EXIT
serve_start "127.0.0.1:$PORT" "$WORK/serve.log" "$BIN" --data-dir "$WORK/data" --log-level warn --retention 0 --compaction 0 "${pprof[@]}" || exit 1
SERVER=$SERVE_PID
TICK=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
if [[ -n ${SAMPLE:-} ]]; then
	while kill -0 "$SERVER" 2>/dev/null; do
		echo "$(date +%s.%N | cut -c1-14) $(ticks "$SERVER") $(stat -c %s "$WORK/data/capledger.db-wal" 2>/dev/null || echo 0)" \
			"$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '$1 == "capledger_commit_seconds_count" || $1 == "capledger_commit_seconds_sum" { printf "%s ", $2 }')"
		sleep 0.5
	done >"$WORK/samples" 2>/dev/null &
fi
workers() { curl -s "http://127.0.0.1:$PORT/metrics" | awk '$1 == "capledger_worker_commands_total" { print $2 }'; }
: >"$WORK/p99s"
window() {
	local t0 t1 w0 w1 from profiler=
	from=$(date -u +%T)
	if [[ -n $PPROF_PORT && -n ${2:-} ]]; then
		curl -s "http://127.0.0.1:$PPROF_PORT/debug/pprof/profile?seconds=${DURATION%s}" -o "$WORK/$2.pprof" &
		profiler=$!
	fi
	t0=$(ticks "$SERVER"); w0=$(workers)
	"$BIN" bench --addr "http://127.0.0.1:$PORT" --setup=false --prefill=false --subjects 1000000 \
		--concurrency 64 ${RATE:+--rate "$RATE"} --duration "$DURATION" --warmup 0s --progress=false >"$WORK/out" 2>&1 || true
	t1=$(ticks "$SERVER"); w1=$(workers)
	[[ -n $profiler ]] && wait "$profiler"
	awk -v d=$((t1 - t0)) -v tick="$TICK" -v w="$1" -v from="$from" -v to="$(date -u +%T)" -v ld="$(cut -d' ' -f1-3 /proc/loadavg)" -v rss="$(awk '/VmRSS/{print $2/1024}' /proc/$SERVER/status)" -v p99s="$WORK/p99s" -v w0="$w0" -v w1="$w1" '
		$1 == "ops" { ops = $2 } $1 == "ops/s" { rate = $2 } $1 == "errors" { errs = $2 }
		$1 == "p99" { p99 = $2; if ($3 == "s") p99 *= 1000; else if ($3 == "µs") p99 /= 1000 }
		END { printf "%-9s %s-%s  %6.0f/s  p99 %7.1f ms  cpu %4.0f µs/reserve  workers %6d  errors %s  rss %.0f MB  load %s\n", w, from, to, rate, p99, (ops > 0 ? d / tick * 1e6 / ops : 0), w1 - w0, errs, rss, ld
			print w, p99 >> p99s }' "$WORK/out"
}
window warmup
window outside
window outside outside
if (( $(date +%s) >= end )); then echo "# the outside windows ran past the epoch's end"; fi
while (( $(date +%s) < end + 2 )); do sleep 0.2; done
window rollover rollover
window rollover
window rollover
awk '$1 == "outside" { sum += $2; n++ } $1 == "rollover" { r[++m] = $2 }
	END { printf "p99 rollover/outside (the outside windows'"'"' mean %.1f ms):", sum / n; for (i = 1; i <= m; i++) printf " %.2f", r[i] / (sum / n); print "" }' "$WORK/p99s"
grep -v '^$' "$WORK/serve.log" | tail -5
