#!/usr/bin/env bash
# pipelined_ab.sh: capledger serve with the default commit (the WAL fsynced
# inside each COMMIT) against serve --pipelined-sync (the next batch
# applied while the previous one's fsync runs), interleaved on this
# machine: in each round every scenario runs against both servers, one
# after the other, so load from elsewhere hits both alike. Prints every
# run and the median over rounds of pipelined/default per scenario:
# reservations per second, p50, p99 and the server's CPU µs per
# reservation (from /proc, over the whole run).
#
# Usage: scripts/pipelined_ab.sh        ROUNDS=5 DURATION=5s scripts/pipelined_ab.sh
# Environment: ROUNDS (3) DURATION (3s) WARMUP (500ms) CONCURRENCY (64)
#   BATCH (100) BATCH_CONCURRENCY (4) BASE_PORT (17480)
#   SCENARIOS (default "c64 c1 batch hog"; hog is c64 beside two busy loops)
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-500ms}
CONCURRENCY=${CONCURRENCY:-64}
BATCH=${BATCH:-100}
BATCH_CONCURRENCY=${BATCH_CONCURRENCY:-4}
BASE_PORT=${BASE_PORT:-17480}
SCENARIOS=${SCENARIOS:-"c64 c1 batch hog"}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORKDIR=$(mktemp -d /tmp/capledger-pipelined.XXXXXX)

# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
cleanup() {
	serve_stop
	rm -rf "$WORKDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { printf '%s\n' "$*" >&2; }

CAPLEDGER="$WORKDIR/capledger"
(cd "$REPO" && go build -o "$CAPLEDGER" ./cmd/capledger)

declare -A PID PORT
start() { # name port flags...
	local name=$1 port=$2
	shift 2
	mkdir -p "$WORKDIR/$name"
	serve_start "127.0.0.1:$port" "$WORKDIR/$name.log" "$CAPLEDGER" --data-dir "$WORKDIR/$name" "$@" || exit 1
	PID[$name]=$SERVE_PID
	PORT[$name]=$port
}
start default "$BASE_PORT"
start pipelined "$((BASE_PORT + 1))" --pipelined-sync

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
bench_row() { sed -n "s#^$2   *\([^ ]*\).*#\1#p" "$1" | head -1; }
RESULTS="$WORKDIR/results.tsv"
: >"$RESULTS"

run() { # round scenario server bench-args...
	local round=$1 scenario=$2 server=$3
	shift 3
	local out="$WORKDIR/run-$round-$scenario-$server.txt" pid=${PID[$server]} ticks0 t0 t1
	ticks0=$(cpu_ticks "$pid")
	t0=$(date +%s.%N)
	"$CAPLEDGER" bench --progress=false --duration "$DURATION" --warmup "$WARMUP" --addr "http://127.0.0.1:${PORT[$server]}" "$@" >"$out" 2>&1 || true
	t1=$(date +%s.%N)
	local rate cpu
	rate=$(bench_row "$out" "reservations/s")
	[[ -n $rate ]] || rate=$(bench_row "$out" "ops/s")
	cpu=$(awk -v d="$(($(cpu_ticks "$pid") - ticks0))" -v tick="$TICK" -v t0="$t0" -v t1="$t1" -v rate="$rate" \
		'BEGIN { if (rate > 0) printf "%.1f", d / tick * 1e6 / (rate * (t1 - t0)); else print 0 }')
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$scenario" "$server" "$rate" "$(bench_row "$out" p50)" \
		"$(bench_row "$out" p99)" "$cpu" "$(cut -d' ' -f1 /proc/loadavg)" >>"$RESULTS"
	printf '  %-6s %-9s %10s/s  p50 %8s ms  p99 %8s ms  server cpu %7s µs/res  load %s  errors %s\n' "$scenario" "$server" "$rate" \
		"$(bench_row "$out" p50)" "$(bench_row "$out" p99)" "$cpu" "$(cut -d' ' -f1 /proc/loadavg)" "$(bench_row "$out" errors)" >&2
}

both() { # round scenario bench-args...: both servers, in an order that alternates by round
	local round=$1 scenario=$2
	shift 2
	if ((round % 2)); then
		run "$round" "$scenario" default "$@"
		run "$round" "$scenario" pipelined "$@"
	else
		run "$round" "$scenario" pipelined "$@"
		run "$round" "$scenario" default "$@"
	fi
}
c64() { both "$1" c64 --mode reserve --concurrency "$CONCURRENCY" --protocol connect; }
c1() { both "$1" c1 --mode reserve --concurrency 1 --protocol connect; }
batch() { both "$1" batch --mode batch --concurrency "$BATCH_CONCURRENCY" --batch-size "$BATCH" --protocol connect; }
hog() {
	local hogs=()
	for _ in 1 2; do
		sh -c 'while :; do :; done' &
		hogs+=($!)
	done
	both "$1" hog --mode reserve --concurrency "$CONCURRENCY" --protocol connect
	kill "${hogs[@]}" 2>/dev/null || true
	wait "${hogs[@]}" 2>/dev/null || true
}

log "machine: $(nproc) vCPU, $(uname -sr); $ROUNDS rounds x $DURATION; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for server in default pipelined; do # unmeasured: page cache, row cache, first account
	"$CAPLEDGER" bench --progress=false --duration 2s --warmup 0s --concurrency "$CONCURRENCY" --addr "http://127.0.0.1:${PORT[$server]}" >/dev/null 2>&1 || true
done
for round in $(seq "$ROUNDS"); do
	log "round $round"
	for s in $SCENARIOS; do "$s" "$round"; done
done

# Ratios pipelined/default within each round, then the median over rounds.
awk -F'\t' '
	{ key = $1 SUBSEP $2; v[key, $3, "rate"] = $4; v[key, $3, "p50"] = $5; v[key, $3, "p99"] = $6; v[key, $3, "cpu"] = $7
	  sc[$2] = 1; rounds[$1] = 1; load[$1] = load[$1] " " $8 }
	function median(a, n,   i, j, t) {
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	END {
		printf "%-6s %14s %14s %14s %14s   (pipelined / default, median of rounds)\n", "", "reservations/s", "p50", "p99", "server cpu/res"
		for (s in sc) {
			printf "%-6s", s
			split("rate p50 p99 cpu", m, " ")
			for (k = 1; k <= 4; k++) {
				n = 0
				for (r in rounds) { d = v[r, s, "default", m[k]]; p = v[r, s, "pipelined", m[k]]; if (d > 0 && p > 0) x[++n] = p / d }
				printf " %13.2fx", (n ? median(x, n) : 0)
			}
			printf "\n"
		}
		for (i = 1; i <= 2; i++) {
			srv = (i == 1) ? "default" : "pipelined"; n = 0
			for (r in rounds) { q = v[r, "c64", srv, "p99"]; h = v[r, "hog", srv, "p99"]; if (q > 0 && h > 0) x[++n] = h / q }
			if (n) printf "%s: p99 beside a CPU hog / quiet c64 p99: %.2fx (goal <= 3x)\n", srv, median(x, n)
		}
		for (r in rounds) printf "round %s load:%s\n", r, load[r]
	}' "$RESULTS"
