#!/bin/bash
# scripts/idle-serve.sh BIN SEED WORK: what serve's workers cost with
# nothing due (issue 15: worker CPU per minute with 1M idle accounts). One
# `BIN serve` (default flags, or SERVE_FLAGS) on a copy of SEED (a data
# directory made by `bench --subjects 1000000 --epoch-length 24h`; never
# served in place) in WORK/data, its RESERVED holds pushed a week out (no
# expiry is due; the 24h epochs end at midnight UTC), and no client. Prints
# serve's CPU (/proc utime+stime) at start-up (from exec until SETTLE
# seconds after it answers /readyz: opening, the first worker passes) and then per minute for
# MINUTES (default 4), with the workers' committed commands (/metrics),
# RSS and load. With PPROF_PORT, serve listens for profiles there and a
# CPU profile of the start-up and of each minute is written to
# WORK/start-up.pprof, WORK/minute-N.pprof. Run it under
# `flock /work/bench.lock`.
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -u
BIN=$1; SRC=$2; WORK=$3; PORT=${PORT:-47562}; MINUTES=${MINUTES:-4}; SETTLE=${SETTLE:-60}
rm -rf "$WORK/data"; cp -r "$SRC" "$WORK/data"
sqlite3 "$WORK/data/capledger.db" "PRAGMA busy_timeout=5000;
	UPDATE reservations SET expires_at = expires_at + 604800000000000, due_at = due_at + 604800000000000 WHERE state = 1;" >/dev/null
echo "# $(basename "$BIN") idle, flags: ${SERVE_FLAGS:-(defaults)}; $(uptime)"
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
trap 'serve_stop; wait 2>/dev/null' EXIT
# serve_start retries PORT while a connection holds it (it is inside
# Linux's ephemeral range) and waits for /readyz.
# shellcheck disable=SC2086
serve_start "127.0.0.1:$PORT" "$WORK/serve.log" "$BIN" --data-dir "$WORK/data" --log-level info \
	${PPROF_PORT:+--pprof-addr 127.0.0.1:$PPROF_PORT} ${SERVE_FLAGS:-} || exit 1
SERVER=$SERVE_PID
TICK=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$SERVER/stat"; }
workers() { curl -s "http://127.0.0.1:$PORT/metrics" | awk '$1 == "capledger_worker_commands_total" { print $2 }'; }
report() { # label ticks0 ticks1 seconds
	printf "%-10s cpu %6.2f s over %3d s (%5.2f s per 60 s)  workers %s  rss %.0f MB  load %s\n" "$1" \
		"$(echo "($3 - $2) / $TICK" | bc -l)" "$4" "$(echo "($3 - $2) / $TICK * 60 / $4" | bc -l)" \
		"$(workers)" "$(awk '/VmRSS/{print $2/1024}' "/proc/$SERVER/status")" "$(cut -d' ' -f1-3 /proc/loadavg)"
}
profile() { # name seconds: in the background
	[[ -n ${PPROF_PORT:-} ]] && curl -s "http://127.0.0.1:$PPROF_PORT/debug/pprof/profile?seconds=$2" -o "$WORK/$1.pprof" &
}
profile start-up $((SETTLE - 1))
sleep "$SETTLE"
t0=$(ticks)
report start-up 0 "$t0" "$SETTLE"
for m in $(seq "$MINUTES"); do
	profile "minute-$m" 59
	sleep 60
	t1=$(ticks)
	report "minute $m" "$t0" "$t1" 60
	t0=$t1
done
grep -v '^$' "$WORK/serve.log" | tail -5
