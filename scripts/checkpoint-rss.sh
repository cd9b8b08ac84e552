#!/bin/bash
# checkpoint-rss.sh BIN DATA PORT OUT (docs/PERFORMANCE.md, a million tenants): serve a copy of the 1M store, sample RSS,
# the server's CPU seconds (user + system), the WAL's size and the compaction counters every 5 s until the first
# checkpoint is stored plus 30 s (at most $MAX s, default 540), then stop it. With PPROF=PORT (a binary with
# serve --pprof-addr), it also saves a heap profile every 30 s and back-to-back 40 s CPU profiles in $out.d.
# The elapsed times count from the start of serve; sampling begins once it answers /readyz (scripts/lib/serve.sh).
bin=$1 data=$2 port=$3 out=$4
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
tck=$(getconf CLK_TCK)
echo "start $(date -u +%T) $(uptime)" > "$out"
extra=()
[ -n "$PPROF" ] && extra=(--pprof-addr "127.0.0.1:$PPROF") && mkdir -p "$out.d"
cpuj=
trap '[ -z "$cpuj" ] || kill "$cpuj" 2>/dev/null; serve_stop' EXIT
t0=$(date +%s); done_at=0; walmax=0
serve_start "127.0.0.1:$port" "$out.serve.log" "$bin" --data-dir "$data" "${extra[@]}" || exit 1
pid=$SERVE_PID
if [ -n "$PPROF" ]; then
  ( sleep 3; for i in $(seq 0 20); do curl -s -o "$out.d/cpu$i.pprof" "http://127.0.0.1:$PPROF/debug/pprof/profile?seconds=40" || break; done ) &
  cpuj=$!
fi
while sleep 5; do
  now=$(date +%s); el=$((now-t0))
  rss=$(grep VmRSS "/proc/$pid/status" | awk '{print $2}'); hwm=$(grep VmHWM "/proc/$pid/status" | awk '{print $2}')
  cpu=$(awk -v t="$tck" '{printf "%.1f", ($14+$15)/t}' "/proc/$pid/stat")
  wal=$(stat -c %s "$data/capledger.db-wal" 2>/dev/null || echo 0); wal=$((wal/1000000)); [ "$wal" -gt "$walmax" ] && walmax=$wal
  cps=$(curl -s --max-time 3 "http://127.0.0.1:$port/statusz" | python3 -c 'import json,sys; d=json.load(sys.stdin); c=d.get("compaction") or {}; print(c.get("checkpoints",0), c.get("last_seq", c.get("lastSeq","?")))' 2>/dev/null)
  echo "t=${el}s rss_kb=$rss hwm_kb=$hwm cpu_s=$cpu wal_mb=$wal checkpoints=$cps" >> "$out"
  [ -n "$PPROF" ] && [ $((el % 30)) -lt 5 ] && curl -s -o "$out.d/heap$el.pprof" "http://127.0.0.1:$PPROF/debug/pprof/heap"
  # shellcheck disable=SC2086 # "checkpoints last_seq" into $1 $2
  set -- $cps
  if [ "${1:-0}" -ge 1 ] && [ "$done_at" = 0 ]; then done_at=$now; fi
  if [ "$done_at" != 0 ] && [ $((now-done_at)) -ge 30 ]; then break; fi
  if [ "$el" -ge "${MAX:-540}" ]; then echo timeout >> "$out"; break; fi
done
echo "peak hwm_kb=$hwm cpu_s=$cpu wal_peak_mb=$walmax" >> "$out"
[ -n "$cpuj" ] && kill "$cpuj" 2>/dev/null; cpuj=
serve_stop "$pid"
echo "end $(date -u +%T) $(uptime)" >> "$out"
