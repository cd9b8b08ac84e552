#!/usr/bin/env bash
# committer.sh: how busy the one committer is, over many subjects and one
# hot subject (issue 15), on copies of a prefilled data directory (SEED,
# as scripts/subjects.sh), one server per binary and round.
#
#   SEED=DIR scripts/committer.sh BINARY [BINARY...]
#
# Per round and binary: a copy of SEED, a server on it, a warmup over the
# subjects, then a window of SUBJECTS random subjects and one of the hot
# subject (c64 single reserves). Each window prints reserves/s, the
# committer's wall time per command (capledger_commit_seconds_sum over
# capledger_batch_commands_sum, from /metrics) and its share of the
# window (busy: near 100 % means the committer is the bound), commands
# per batch, and the server's CPU per command. A committer busy all the
# time whose time per command matches the server's CPU per command is
# bounded by the CPU it gets, not by waiting.
#
# Environment: SUBJECTS (1000000), ROUNDS (2), DURATION (10, seconds),
# WARMUP (8s), PORT (27494), WORK (a directory for the copies).
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
[[ -n ${SEED:-} ]] || { echo "committer.sh: SEED is required" >&2; exit 2; }
SUBJECTS=${SUBJECTS:-1000000} ROUNDS=${ROUNDS:-2} DURATION=${DURATION:-10} WARMUP=${WARMUP:-8s}
PORT=${PORT:-27494} WORK=${WORK:-$(mktemp -d)}
TICK=$(getconf CLK_TCK)
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
trap 'serve_stop; rm -rf "$WORK/data"' EXIT
metrics() {
	curl -s "http://127.0.0.1:$PORT/metrics" | awk '$1 == "capledger_commit_seconds_sum" { s = $2 }
		$1 == "capledger_batch_commands_sum" { c = $2 } $1 == "capledger_batch_commands_count" { b = $2 }
		END { printf "%s %s %s\n", s, c, b }'
}
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
echo "# SEED=$SEED SUBJECTS=$SUBJECTS DURATION=${DURATION}s; $(uptime)"
for r in $(seq "$ROUNDS"); do
	for bin in "$@"; do
		rm -rf "$WORK/data"
		cp -r "$SEED" "$WORK/data"
		serve_start "127.0.0.1:$PORT" "$WORK/serve.log" "$bin" --data-dir "$WORK/data" --log-level warn \
			--retention 0 --compaction 0
		SERVER=$SERVE_PID
		"$bin" bench --addr "http://127.0.0.1:$PORT" --setup=false --prefill=false --subjects "$SUBJECTS" \
			--duration "$WARMUP" --warmup 0s --progress=false >/dev/null 2>&1 || true
		for n in "$SUBJECTS" 1; do
			read -r s0 c0 b0 < <(metrics)
			t0=$(ticks "$SERVER")
			"$bin" bench --addr "http://127.0.0.1:$PORT" --setup=false --prefill=false --subjects "$n" \
				--duration "${DURATION}s" --warmup 0s --progress=false >"$WORK/out" 2>&1 || true
			read -r s1 c1 b1 < <(metrics)
			t1=$(ticks "$SERVER")
			awk -v b="$(basename "$bin")" -v r="$r" -v n="$n" -v s0="$s0" -v s1="$s1" -v c0="$c0" -v c1="$c1" \
				-v b0="$b0" -v b1="$b1" -v d="$DURATION" -v cpu=$((t1 - t0)) -v tick="$TICK" \
				-v rate="$(awk '$1 == "ops/s" { print $2 }' "$WORK/out")" -v ld="$(cut -d' ' -f1-3 /proc/loadavg)" '
				BEGIN { s = s1 - s0; c = c1 - c0; nb = b1 - b0; if (c <= 0) c = 1; if (nb <= 0) nb = 1
					printf "%-20s round %d subjects %-7d %6s/s committer %5.1f µs/command (busy %3.0f%%), %4.1f commands/batch, server cpu %3.0f µs/command | load %s\n",
						b, r, n, rate, s / c * 1e6, s / d * 100, c / nb, cpu / tick * 1e6 / c, ld }'
		done
		serve_stop "$SERVER"
	done
done
