#!/usr/bin/env bash
# subjects.sh: single reserves over many subjects against one hot subject,
# in the same run, interleaved (issue 15: random single reserves over
# 1,000,000 subjects >= 0.8x one hot subject), on copies of a prefilled
# data directory, one server per binary and round.
#
#   SEED=DIR scripts/subjects.sh BINARY[@SEEDDIR] [BINARY[@SEEDDIR]...]
#
# BINARY@SEEDDIR runs that binary on a copy of SEEDDIR instead of SEED
# (the same binary on two files, e.g. one rebuilt with another
# page_size: main@/tmp/seed4096 main@/tmp/seed2048).
# SEED is a data directory prefilled with
#   capledger serve --data-dir SEED --retention 0 --compaction 0 &
#   capledger bench --subjects 1000000 --epoch-length 24h --duration 1s
# (the bench policy, one reserve per subject; holds last an hour, so
# measure within the hour or the expiry worker expires the prefill's
# holds beside the load). Per round and binary: a copy of SEED, a server
# on it (retention and compaction off, the workers on), a warmup over
# the subjects, then PAIRS pairs of windows, SUBJECTS random subjects and
# one hot subject alternating (which comes first alternates by pair).
# Every window prints reserves/s, p99 and the server's CPU per reserve
# (user + system from /proc over the window, divided by the reserves):
# the load-insensitive figure. Each pair prints its ratios, many over hot.
#
# Environment: SUBJECTS (1000000), ROUNDS (2), PAIRS (2), DURATION (10s),
# WARMUP (10s), CONCURRENCY (64), PORT (27493), SERVE_FLAGS (added to
# every server), WORK (a directory for the copies; default mktemp -d),
# MODE (reserve; batch: one ReserveBatch of BATCH reservations per op, and
# "cpu" is then per reservation), BATCH (100), HOT (the subjects of the
# other window: 1; the batch goal compares with 10), BENCH (the binary
# whose bench drives the load; default each measured binary: give one
# with --seed, which draws new subjects per window, when a measured
# binary's bench predates it and would revisit the same subjects).
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
for arg in "$@"; do
	[[ $arg == *@* || -n ${SEED:-} ]] || { echo "subjects.sh: SEED is required (or BINARY@SEEDDIR)" >&2; exit 2; }
done
SUBJECTS=${SUBJECTS:-1000000} ROUNDS=${ROUNDS:-2} PAIRS=${PAIRS:-2}
DURATION=${DURATION:-10s} WARMUP=${WARMUP:-10s} CONCURRENCY=${CONCURRENCY:-64}
PORT=${PORT:-27493} MODE=${MODE:-reserve} BATCH=${BATCH:-100} HOT=${HOT:-1}
WORK=${WORK:-$(mktemp -d)}
TICK=$(getconf CLK_TCK)
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
trap 'serve_stop; rm -rf "$WORK/data"' EXIT
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
row() { sed -n "s#^$2   *\([^ ]*\).*#\1#p" "$1" | head -1; }
window() { # binary subjects -> "ops/s p99_ms cpu_us_per_reserve"
	local t0 t1
	t0=$(ticks "$SERVER")
	"${BENCH:-$1}" bench --addr "http://127.0.0.1:$PORT" --setup=false --prefill=false --subjects "$2" \
		--mode "$MODE" --batch-size "$BATCH" \
		--concurrency "$CONCURRENCY" --duration "$DURATION" --warmup 0s --progress=false >"$WORK/out" 2>&1 || true
	t1=$(ticks "$SERVER")
	awk -v d=$((t1 - t0)) -v tick="$TICK" -v per="$([[ $MODE == batch ]] && echo "$BATCH" || echo 1)" '
		$1 == "ops" { ops = $2 * per } $1 == "ops/s" { rate = $2 }
		$1 == "p99" { p99 = $2; if ($3 == "s") p99 *= 1000; else if ($3 == "µs") p99 /= 1000 }
		END { printf "%.0f %.1f %.0f\n", rate, p99, (ops > 0 ? d / tick * 1e6 / ops : 0) }' "$WORK/out"
}
echo "# SEED=${SEED:-} SUBJECTS=$SUBJECTS HOT=$HOT MODE=$MODE BATCH=$BATCH DURATION=$DURATION CONCURRENCY=$CONCURRENCY; $(uptime)"
for r in $(seq "$ROUNDS"); do
	for arg in "$@"; do
		bin=${arg%%@*} seed=${SEED:-} label=$(basename "$bin")
		if [[ $arg == *@* ]]; then
			seed=${arg#*@} label="$label@$(basename "$seed")"
		fi
		rm -rf "$WORK/data"
		cp -r "$seed" "$WORK/data"
		# shellcheck disable=SC2086
		serve_start "127.0.0.1:$PORT" "$WORK/serve.log" "$bin" --data-dir "$WORK/data" --log-level warn \
			--retention 0 --compaction 0 ${SERVE_FLAGS:-}
		SERVER=$SERVE_PID
		"${BENCH:-$bin}" bench --addr "http://127.0.0.1:$PORT" --setup=false --prefill=false --subjects "$SUBJECTS" \
			--mode "$MODE" --batch-size "$BATCH" --concurrency "$CONCURRENCY" --duration "$WARMUP" --warmup 0s --progress=false >/dev/null 2>&1 || true
		for p in $(seq "$PAIRS"); do
			if ((p % 2)); then
				many=$(window "$bin" "$SUBJECTS"); hot=$(window "$bin" "$HOT")
			else
				hot=$(window "$bin" "$HOT"); many=$(window "$bin" "$SUBJECTS")
			fi
			read -r mr mp mc <<<"$many"
			read -r hr hp hc <<<"$hot"
			awk -v b="$label" -v r="$r" -v p="$p" -v mr="$mr" -v hr="$hr" -v mc="$mc" -v hc="$hc" \
				-v mp="$mp" -v hp="$hp" -v ld="$(cut -d' ' -f1-3 /proc/loadavg)" \
				'BEGIN { printf "%-22s round %d pair %d: many %s/s p99 %s ms cpu %s µs | hot %s/s p99 %s ms cpu %s µs | ratio %.2f, cpu %.2fx | load %s\n", b, r, p, mr, mp, mc, hr, hp, hc, (hr > 0 ? mr / hr : 0), (hc > 0 ? mc / hc : 0), ld }'
		done
		serve_stop "$SERVER"
	done
done
