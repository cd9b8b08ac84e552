#!/usr/bin/env bash
# compare.sh: capledger against its baselines, interleaved, on this machine.
#
# Starts, on loopback ports of its own (BASE_PORT..BASE_PORT+5):
#   - capledger serve (embedded SQLite, synchronous=FULL: every decision
#     fsynced before its answer), built from this checkout;
#   - gubernator v2.13.0 (in memory, nothing durable), found on PATH or in
#     $(go env GOPATH)/bin, else installed with go install;
#   - two redis-server (Debian's /usr/bin/redis-server): one without
#     persistence, one with --appendonly yes --appendfsync always (fsync
#     before every answer), both driven with a Lua token bucket by EVALSHA
#     (capledger bench --mode redis / redis-batch: pipelined x BATCH);
#   - a bare HTTP/JSON echo server (capledger bench --echo-server), the
#     floor of one HTTP round trip on this machine;
# then runs ROUNDS rounds; in each round every scenario runs every system
# once, one after the other, so that load from elsewhere on the machine
# hits all of them alike. It prints one row per round and system, and a
# table of the medians with capledger's ratio to each baseline (a ratio is
# taken within a round, then the median over rounds), with the load
# average of every round. Everything it started is stopped at exit.
#
# Usage: scripts/compare.sh            (defaults below)
#        ROUNDS=5 DURATION=10s scripts/compare.sh
# Environment:
#   ROUNDS (3)  DURATION (5s, per run)  WARMUP (1s)  CONCURRENCY (64)
#   BATCH (100) BATCH_CONCURRENCY (4)   BASE_PORT (17400)
#   SCENARIOS   (default "c64 batch c1 hog"; hog runs capledger c64 beside
#               two CPU-bound busy loops and compares its p99 with c64's)
#   WORKDIR     (default a new mktemp -d, removed at exit unless KEEP=1)
#   GUBERNATOR  (path of a gubernator binary; default: find or install;
#               "skip" leaves gubernator out)
#   REF         (capledger-connect) the capledger system the ratios are
#               of; capledger-grpcgo is capledger driven by a grpc-go
#               client (bench --protocol grpc-go), the client stack of
#               gubernator-grpc, served by grpc-go's transport
#   ONLY        (unset) a space-separated list of systems to run, e.g.
#               "capledger-grpcgo gubernator-grpc redis-aof-always"
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
CONCURRENCY=${CONCURRENCY:-64}
BATCH=${BATCH:-100}
BATCH_CONCURRENCY=${BATCH_CONCURRENCY:-4}
BASE_PORT=${BASE_PORT:-17400}
SCENARIOS=${SCENARIOS:-"c64 batch c1 hog"}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORKDIR=${WORKDIR:-$(mktemp -d /tmp/capledger-compare.XXXXXX)}
mkdir -p "$WORKDIR"

# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
PIDS=()
cleanup() {
	serve_stop
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	[[ ${KEEP:-0} == 1 ]] || rm -rf "$WORKDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '%s\n' "$*" >&2; }

# --- binaries -------------------------------------------------------------
CAPLEDGER="$WORKDIR/capledger"
log "building capledger from $REPO"
(cd "$REPO" && go build -o "$CAPLEDGER" ./cmd/capledger)

REDIS=${REDIS:-$(command -v redis-server || echo /usr/bin/redis-server)}
[[ -x $REDIS ]] || { log "redis-server not found: apt-get install redis-server"; exit 1; }

GUBERNATOR=${GUBERNATOR:-$(command -v gubernator || true)}
if [[ $GUBERNATOR == skip ]]; then
	log "leaving gubernator out (GUBERNATOR=skip)"
elif [[ -z $GUBERNATOR ]]; then
	GUBERNATOR="$(go env GOPATH)/bin/gubernator"
	if [[ ! -x $GUBERNATOR ]]; then
		log "installing gubernator v2.13.0 (go install, a few minutes)"
		go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@v2.13.0
	fi
fi

# --- servers --------------------------------------------------------------
CAP_PORT=$BASE_PORT
ECHO_PORT=$((BASE_PORT + 1))
GUBER_GRPC_PORT=$((BASE_PORT + 2))
GUBER_HTTP_PORT=$((BASE_PORT + 3))
REDIS_MEM_PORT=$((BASE_PORT + 4))
REDIS_AOF_PORT=$((BASE_PORT + 5))

declare -A SERVER_PID
start() { # name, command...
	local name=$1
	shift
	"$@" >"$WORKDIR/$name.log" 2>&1 &
	PIDS+=($!)
	SERVER_PID[$name]=$!
}

# cpu_ticks pid: the user + system CPU time the process has used, in clock
# ticks (env execs gubernator, so its pid is gubernator's).
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)

wait_port() { # name, port
	for _ in $(seq 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	log "$1 did not listen on $2; its log:"
	cat "$WORKDIR/$1.log" >&2
	exit 1
}

mkdir -p "$WORKDIR/data" "$WORKDIR/redis-mem" "$WORKDIR/redis-aof"
serve_start "127.0.0.1:$CAP_PORT" "$WORKDIR/capledger.log" "$CAPLEDGER" --data-dir "$WORKDIR/data"
SERVER_PID[capledger]=$SERVE_PID
start echo "$CAPLEDGER" bench --echo-server --addr "127.0.0.1:$ECHO_PORT"
# One gubernator instance, no peers.
[[ $GUBERNATOR == skip ]] || start gubernator env GUBER_GRPC_ADDRESS="127.0.0.1:$GUBER_GRPC_PORT" \
	GUBER_HTTP_ADDRESS="127.0.0.1:$GUBER_HTTP_PORT" GUBER_LOG_LEVEL=error "$GUBERNATOR"
start redis-mem "$REDIS" --port "$REDIS_MEM_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORKDIR/redis-mem"
start redis-aof "$REDIS" --port "$REDIS_AOF_PORT" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always --dir "$WORKDIR/redis-aof"
# capledger answered /readyz above; the others get an open port.
for s in echo:$ECHO_PORT $([[ $GUBERNATOR == skip ]] || echo gubernator:$GUBER_GRPC_PORT) redis-mem:$REDIS_MEM_PORT redis-aof:$REDIS_AOF_PORT; do
	wait_port "${s%%:*}" "${s##*:}"
done
# gubernator adds itself to its peer pool shortly after it listens (until
# then every call fails with "pool is empty"): wait for a call to pass.
if [[ $GUBERNATOR != skip ]]; then
	for i in $(seq 50); do
		"$CAPLEDGER" bench --mode gubernator --protocol grpc --addr "127.0.0.1:$GUBER_GRPC_PORT" --concurrency 1 \
			--duration 100ms --warmup 0s --progress=false >/dev/null 2>&1 && break
		[[ $i == 50 ]] && { log "gubernator never answered; its log:"; cat "$WORKDIR/gubernator.log" >&2; exit 1; }
		sleep 0.2
	done
fi

# --- runs -----------------------------------------------------------------
RESULTS="$WORKDIR/results.tsv" # round scenario system throughput p50 p99 load server-cpu client-cpu
: >"$RESULTS"

# bench_row: the value of a row of bench's table (the number before a unit).
bench_row() { sed -n "s#^$2   *\([^ ]*\).*#\1#p" "$1" | head -1; }

# server_of system: the name its server was started under.
server_of() {
	case $1 in
	capledger-*) echo capledger ;;
	gubernator-*) echo gubernator ;;
	redis-aof-always) echo redis-aof ;;
	redis-memory) echo redis-mem ;;
	echo-*) echo echo ;;
	esac
}

# run round scenario system -- bench args...
# Records per run: per second (reservations, or calls), p50, p99, the load
# average, and the CPU each side used per reservation (or call), in µs:
# the server's from /proc over the whole run (warm-up included, which runs
# at the same rate), the client's (bench) over the measured time.
run() {
	local round=$1 scenario=$2 system=$3
	shift 4
	if [[ -n ${ONLY:-} && " $ONLY " != *" $system "* ]]; then
		return 0
	fi
	local out="$WORKDIR/run-$round-$scenario-$system.txt"
	local pid=${SERVER_PID[$(server_of "$system")]}
	local ticks0 t0 t1
	ticks0=$(cpu_ticks "$pid")
	t0=$(date +%s.%N)
	if ! "$CAPLEDGER" bench --progress=false --duration "$DURATION" --warmup "$WARMUP" "$@" >"$out" 2>"$out.err"; then
		log "round $round $scenario $system failed:"
		cat "$out" "$out.err" >&2
		return 1
	fi
	t1=$(date +%s.%N)
	local rate server_cpu client_cpu
	rate=$(bench_row "$out" "reservations/s")
	[[ -n $rate ]] || rate=$(bench_row "$out" "ops/s")
	server_cpu=$(awk -v d="$(($(cpu_ticks "$pid") - ticks0))" -v tick="$TICK" -v t0="$t0" -v t1="$t1" -v rate="$rate" \
		'BEGIN { if (rate > 0) printf "%.1f", d / tick * 1e6 / (rate * (t1 - t0)); else print 0 }')
	client_cpu=$(awk -v c="$(bench_row "$out" "client cpu/op")" -v ops="$(bench_row "$out" "ops/s")" -v rate="$rate" \
		'BEGIN { if (rate > 0) printf "%.1f", c * ops / rate; else print 0 }')
	local errors
	errors=$(bench_row "$out" "errors")
	[[ $errors == 0 ]] || log "round $round $scenario $system: $errors errors ($(grep '^first error' "$out" || true))"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$scenario" "$system" "$rate" \
		"$(bench_row "$out" p50)" "$(bench_row "$out" p99)" "$(cut -d' ' -f1 /proc/loadavg)" "$server_cpu" "$client_cpu" >>"$RESULTS"
	printf '  %-9s %-20s %10s/s  p50 %8s ms  p99 %8s ms  cpu µs server %7s client %7s  load %s\n' "$scenario" "$system" "$rate" \
		"$(bench_row "$out" p50)" "$(bench_row "$out" p99)" "$server_cpu" "$client_cpu" "$(cut -d' ' -f1 /proc/loadavg)" >&2
}

CAP="--addr http://127.0.0.1:$CAP_PORT"
c64() {
	local r=$1 c="--concurrency $CONCURRENCY"
	run "$r" c64 capledger-connect -- --mode reserve $c $CAP --protocol connect
	run "$r" c64 capledger-grpc -- --mode reserve $c $CAP --protocol grpc
	run "$r" c64 capledger-grpcgo -- --mode reserve $c $CAP --protocol grpc-go
	if [[ $GUBERNATOR != skip ]]; then
		run "$r" c64 gubernator-grpc -- --mode gubernator $c --addr "127.0.0.1:$GUBER_GRPC_PORT" --protocol grpc
		run "$r" c64 gubernator-json -- --mode gubernator $c --addr "127.0.0.1:$GUBER_HTTP_PORT"
	fi
	run "$r" c64 redis-aof-always -- --mode redis $c --addr "127.0.0.1:$REDIS_AOF_PORT"
	run "$r" c64 redis-memory -- --mode redis $c --addr "127.0.0.1:$REDIS_MEM_PORT"
	run "$r" c64 echo-json -- --mode echo $c --addr "127.0.0.1:$ECHO_PORT"
}
batch() {
	local r=$1 c="--concurrency $BATCH_CONCURRENCY --batch-size $BATCH"
	run "$r" batch capledger-connect -- --mode batch $c $CAP --protocol connect
	run "$r" batch capledger-json -- --mode batch $c $CAP --protocol connect-json
	run "$r" batch redis-aof-always -- --mode redis-batch $c --addr "127.0.0.1:$REDIS_AOF_PORT"
	run "$r" batch redis-memory -- --mode redis-batch $c --addr "127.0.0.1:$REDIS_MEM_PORT"
}
c1() {
	local r=$1
	run "$r" c1 capledger-connect -- --mode reserve --concurrency 1 $CAP --protocol connect
	run "$r" c1 capledger-grpcgo -- --mode reserve --concurrency 1 $CAP --protocol grpc-go
	run "$r" c1 redis-aof-always -- --mode redis --concurrency 1 --addr "127.0.0.1:$REDIS_AOF_PORT"
	run "$r" c1 echo-json -- --mode echo --concurrency 1 --addr "127.0.0.1:$ECHO_PORT"
}
hog() {
	local r=$1 hogs=()
	# Two busy loops, one per vCPU of the machine this was written for, at
	# the same priority as the server.
	for _ in 1 2; do
		sh -c 'while :; do :; done' &
		hogs+=($!)
	done
	run "$r" hog capledger-connect -- --mode reserve --concurrency "$CONCURRENCY" $CAP --protocol connect || true
	run "$r" hog capledger-grpcgo -- --mode reserve --concurrency "$CONCURRENCY" $CAP --protocol grpc-go || true
	kill "${hogs[@]}" 2>/dev/null || true
	wait "${hogs[@]}" 2>/dev/null || true
}

log "machine: $(nproc) vCPU, $(uname -sr); rounds $ROUNDS x $DURATION; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
# One unmeasured run first: the server's first seconds (page cache, row
# cache, the policy's first account) belong to no round.
"$CAPLEDGER" bench --progress=false --duration "$DURATION" --warmup 0s --concurrency "$CONCURRENCY" $CAP >/dev/null 2>&1 || true
for round in $(seq "$ROUNDS"); do
	log "round $round"
	for s in $SCENARIOS; do
		"$s" "$round"
	done
done

# --- table ----------------------------------------------------------------
# Medians over rounds of every system's figures, then capledger's ratio to
# each baseline of the scenario: throughput capledger/baseline (higher is
# better for capledger) and p50 / p99 capledger/baseline (lower is better).
echo "capledger compare: $(nproc) vCPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $ROUNDS rounds x $DURATION, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "load average per run: min $(cut -f7 "$RESULTS" | sort -n | head -1), max $(cut -f7 "$RESULTS" | sort -n | tail -1)"
echo
REF=${REF:-capledger-connect}
awk -F'\t' -v ref_sys="$REF" '
function median(list,   n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
	if (n == 0) return ""
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
	key = $2 SUBSEP $3
	if (!(key in seen)) { seen[key] = 1; order[++n] = key }
	rate[key] = rate[key] " " $4; p50[key] = p50[key] " " $5; p99[key] = p99[key] " " $6
	scpu[key] = scpu[key] " " $8; ccpu[key] = ccpu[key] " " $9
	R[$1, $2, $3, "rate"] = $4; R[$1, $2, $3, "p50"] = $5; R[$1, $2, $3, "p99"] = $6
	rounds[$1] = 1
}
END {
	printf "%-9s %-18s %10s %9s %9s %8s %8s   %s\n", "scenario", "system", "per second", "p50 ms", "p99 ms", "srv µs", "cli µs", ref_sys " / this (median of rounds)"
	for (i = 1; i <= n; i++) {
		split(order[i], k, SUBSEP); sc = k[1]; sys = k[2]
		ratio = ""
		ref = (sc == "hog") ? "c64" : sc
		if (sys != ref_sys || sc == "hog") {
			tr = ""; t50 = ""; t99 = ""
			for (r in rounds) {
				if ((r, ref, ref_sys, "rate") in R && (r, sc, sys, "rate") in R && R[r, sc, sys, "rate"] > 0) {
					num = (sc == "hog") ? R[r, sc, sys, "rate"] : R[r, ref, ref_sys, "rate"]
					den = (sc == "hog") ? R[r, ref, ref_sys, "rate"] : R[r, sc, sys, "rate"]
					tr = tr " " num / den
					if (sc == "hog") {
						t99 = t99 " " R[r, sc, sys, "p99"] / R[r, ref, ref_sys, "p99"]
					} else {
						t50 = t50 " " R[r, ref, ref_sys, "p50"] / R[r, sc, sys, "p50"]
						t99 = t99 " " R[r, ref, ref_sys, "p99"] / R[r, sc, sys, "p99"]
					}
				}
			}
			if (sc == "hog")
				ratio = sprintf("hog/quiet c64: rate %.2fx, p99 %.2fx", median(tr), median(t99))
			else
				ratio = sprintf("rate %.2fx  p50 %.2fx  p99 %.2fx", median(tr), median(t50), median(t99))
		}
		printf "%-9s %-18s %10.0f %9.3f %9.3f %8.1f %8.1f   %s\n", sc, sys, median(rate[order[i]]), median(p50[order[i]]), median(p99[order[i]]), median(scpu[order[i]]), median(ccpu[order[i]]), ratio
	}
}' "$RESULTS"
echo
echo "c64: $CONCURRENCY callers, one reserve (or one limiter call) each; batch: $BATCH_CONCURRENCY callers, $BATCH reservations per call (Redis: $BATCH EVALSHAs pipelined), per second = reservations; c1: one caller."
echo "srv µs / cli µs: CPU time (user + system) of the server and of the load generator per reservation (or call): what two shared cores must pay for each."
