#!/bin/bash
# scripts/rollover-serve.sh BIN SEED WORK: the epoch rollover of every
# account end to end. One `BIN serve --retention 0 --compaction 0` on a copy
# of SEED (a data directory made by `bench --subjects 1000000
# --epoch-length 24h`; never served in place) in WORK/data, its RESERVED
# holds pushed a week out (no expiry runs) and its policies'
# epoch_length_ns set with sqlite3 so that every epoch that began at 00:00
# UTC ends LEAD (default 50) seconds after the start; then windows of
# DURATION (default 15s) of `bench --subjects 1000000 --concurrency 64`:
# a warmup, two inside the epoch, three from 2 s past its end. Prints per
# window reserves/s, p99, server CPU per reserve (/proc), RSS and load.
# Run it under `flock /work/bench.lock`.
set -u
BIN=$1; SRC=$2; WORK=$3; PORT=${PORT:-27461}; DURATION=${DURATION:-15s}; LEAD=${LEAD:-50}
rm -rf "$WORK/data"; cp -r "$SRC" "$WORK/data"
start=$(date +%s)
end=$((start + LEAD))
# LEAD counts from after the copy; the UPDATEs below take about 10 s at 1M.
midnight=$(( (start / 86400) * 86400 ))
len=$(( (end - midnight) ))
sqlite3 "$WORK/data/capledger.db" "PRAGMA busy_timeout=5000; UPDATE policies SET epoch_length_ns = ${len}000000000;
	UPDATE reservations SET expires_at = expires_at + 604800000000000, due_at = due_at + 604800000000000 WHERE state = 1;" >/dev/null
echo "# $(basename "$BIN") epoch ends $(date -u -d @$end +%T) (length ${len}s); $(uptime)"
"$BIN" serve --data-dir "$WORK/data" --addr "127.0.0.1:$PORT" --log-level warn --retention 0 --compaction 0 >"$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
TICK=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
window() {
	local t0 t1 from=$(date -u +%T)
	t0=$(ticks "$SERVER")
	"$BIN" bench --addr "http://127.0.0.1:$PORT" --setup=false --prefill=false --subjects 1000000 \
		--concurrency 64 --duration "$DURATION" --warmup 0s --progress=false >"$WORK/out" 2>&1 || true
	t1=$(ticks "$SERVER")
	awk -v d=$((t1 - t0)) -v tick="$TICK" -v w="$1" -v from="$from" -v ld="$(cut -d' ' -f1-3 /proc/loadavg)" -v rss="$(awk '/VmRSS/{print $2/1024}' /proc/$SERVER/status)" '
		$1 == "ops" { ops = $2 } $1 == "ops/s" { rate = $2 } $1 == "errors" { errs = $2 }
		$1 == "p99" { p99 = $2; if ($3 == "s") p99 *= 1000; else if ($3 == "µs") p99 /= 1000 }
		END { printf "%-9s %s  %6.0f/s  p99 %7.1f ms  cpu %4.0f µs/reserve  errors %s  rss %.0f MB  load %s\n", w, from, rate, p99, (ops > 0 ? d / tick * 1e6 / ops : 0), errs, rss, ld }' "$WORK/out"
}
window warmup
window outside
window outside
while (( $(date +%s) < end + 2 )); do sleep 0.2; done
window rollover
window rollover
window rollover
grep -v '^$' "$WORK/serve.log" | tail -5
