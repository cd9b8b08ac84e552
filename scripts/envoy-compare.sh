#!/usr/bin/env bash
# envoy-compare.sh: ShouldRateLimit throughput, p99 and CPU per check of
# capledger (SQLite, durable) and the reference envoyproxy/ratelimit
# (Redis without persistence), driven alike by `capledger bench --mode
# envoy`, interleaved, at c64 and c1. capledger runs twice: as serve runs
# by default (gRPC on grpc-go's transport) and, as capledger-nethttp, with
# --grpc-transport net/http (connect-go on net/http's HTTP/2 server), on
# data directories of their own.
#
#   ROUNDS=3 DURATION=5s scripts/envoy-compare.sh [capledger-binary]
#   SYSTEMS="capledger reference" leaves capledger-nethttp out;
#   CONCURRENCIES="64" leaves c1 out.
#
# It prints a row per round, concurrency and system (the 1-minute load
# average at its end in the last column), then a summary per round:
# capledger's and the reference's checks/s and p99 side by side and their
# ratio, and the median ratio, so that a p99 that only machine load made
# long shows as long for the reference too.
#
# Needs redis-server (Debian) and service_cmd on PATH or in $(go env
# GOPATH)/bin: go install github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36
# (about 6 minutes on 2 cores).
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-5s} WARMUP=${WARMUP:-1s} BASE=${BASE_PORT:-27500}
SYSTEMS=${SYSTEMS:-"capledger capledger-nethttp reference"} CONCURRENCIES=${CONCURRENCIES:-"64 1"}
WORK=$(mktemp -d)
CAPLEDGER=${1:-}
if [[ -z $CAPLEDGER ]]; then
	CAPLEDGER=$WORK/capledger
	(cd "$(dirname "$0")/.." && go build -o "$CAPLEDGER" ./cmd/capledger)
fi
RL=$(command -v service_cmd || echo "$(go env GOPATH)/bin/service_cmd")
if [[ $SYSTEMS == *reference* && ! -x $RL ]]; then
	echo "envoy-compare: no envoyproxy/ratelimit at $RL; install it (see the top of $0) or set SYSTEMS=\"capledger\"" >&2
	exit 2
fi
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
PIDS=()
trap 'serve_stop; kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/rt/ratelimit/config" "$WORK/redis" "$WORK/data" "$WORK/data-nethttp"
cat >"$WORK/rt/ratelimit/config/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
YAML
cat >"$WORK/mapping.yaml" <<'YAML'
domains:
  - name: bench
    rules:
      - subject: {key: tenant}
        route: {value: bench.reserve}
        unit: tokens
YAML
redis-server --port $((BASE + 0)) --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/redis" >"$WORK/redis.log" 2>&1 &
PIDS+=($!); REDIS_PID=$!
env USE_STATSD=false REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$((BASE + 0)) RUNTIME_ROOT="$WORK/rt" \
	RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false GRPC_HOST=127.0.0.1 GRPC_PORT=$((BASE + 1)) \
	HOST=127.0.0.1 PORT=$((BASE + 2)) DEBUG_HOST=127.0.0.1 DEBUG_PORT=$((BASE + 3)) LOG_LEVEL=warn "$RL" >"$WORK/rl.log" 2>&1 &
PIDS+=($!); RL_PID=$!
serve_start 127.0.0.1:$((BASE + 4)) "$WORK/serve.log" "$CAPLEDGER" --data-dir "$WORK/data" --envoy-config "$WORK/mapping.yaml"
CAP_PID=$SERVE_PID
serve_start 127.0.0.1:$((BASE + 5)) "$WORK/serve-nethttp.log" "$CAPLEDGER" --data-dir "$WORK/data-nethttp" \
	--envoy-config "$WORK/mapping.yaml" --grpc-transport net/http
NET_PID=$SERVE_PID
# The reference: an open gRPC port (BASE below Linux's ephemeral range
# keeps this probe from connecting to itself).
if [[ $SYSTEMS == *reference* ]]; then
	for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((BASE + 1))") 2>/dev/null && break; sleep 0.1; done
fi
row() { sed -n "s#^$2   *\([^ ]*\).*#\1#p" "$1" | head -1; }
ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done; echo $t; }
TICK=$(getconf CLK_TCK)
setup=true setup_net=true
echo "round	c	system	checks/s	p50 ms	p99 ms	srv µs/check	cli µs/check	errors	load"
for r in $(seq "$ROUNDS"); do
	for c in $CONCURRENCIES; do
		for sys in $SYSTEMS; do
			if [[ $sys == capledger ]]; then
				addr=http://127.0.0.1:$((BASE + 4)) pids=("$CAP_PID") extra="--setup=$setup"
				setup=false
			elif [[ $sys == capledger-nethttp ]]; then
				addr=http://127.0.0.1:$((BASE + 5)) pids=("$NET_PID") extra="--setup=$setup_net"
				setup_net=false
			else
				addr=http://127.0.0.1:$((BASE + 1)) pids=("$RL_PID" "$REDIS_PID") extra=--setup=false
			fi
			k0=$(ticks "${pids[@]}") t0=$(date +%s.%N)
			"$CAPLEDGER" bench --mode envoy --progress=false --addr "$addr" $extra --concurrency "$c" --duration "$DURATION" --warmup "$WARMUP" >"$WORK/out" 2>&1 || { cat "$WORK/out" "$WORK/rl.log"; exit 1; }
			k1=$(ticks "${pids[@]}") t1=$(date +%s.%N)
			rate=$(row "$WORK/out" "ops/s")
			srv=$(awk -v d=$((k1 - k0)) -v tick="$TICK" -v t0="$t0" -v t1="$t1" -v rate="$rate" 'BEGIN { printf "%.1f", d / tick * 1e6 / (rate * (t1 - t0)) }')
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$c" "$sys" "$rate" "$(row "$WORK/out" p50)" "$(row "$WORK/out" p99)" "$srv" "$(row "$WORK/out" "client cpu/op")" "$(row "$WORK/out" errors)" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$WORK/rows"
		done
	done
done
# Summary: capledger (grpc-go) against the reference, per round and
# concurrency, from the rows above.
awk -F'\t' '
	{ key = $1 "\t" $2; rate[key, $3] = $4; p99[key, $3] = $6; srv[key, $3] = $7; load[key] = $10
	  if (!(key in seen)) { seen[key] = 1; keys[++n] = key } }
	END {
		print ""
		print "round\tc\tcapledger/s\treference/s\tratio\tp99 capledger ms\tp99 reference ms\tsrv µs capledger\tsrv µs reference\tload"
		for (i = 1; i <= n; i++) {
			k = keys[i]
			if (rate[k, "capledger"] == "" || rate[k, "reference"] == "") continue
			ratio = rate[k, "capledger"] / rate[k, "reference"]
			split(k, rc, "\t"); ratios[rc[2]] = ratios[rc[2]] " " ratio
			printf "%s\t%.0f\t%.0f\t%.2fx\t%s\t%s\t%s\t%s\t%s\n", k, rate[k, "capledger"], rate[k, "reference"], ratio, p99[k, "capledger"], p99[k, "reference"], srv[k, "capledger"], srv[k, "reference"], load[k]
		}
		for (c in ratios) {
			m = split(substr(ratios[c], 2), v, " ")
			for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (v[b] < v[a]) { t = v[a]; v[a] = v[b]; v[b] = t }
			med = (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
			printf "c%s: capledger/reference median %.2fx over %d rounds (%.2f-%.2fx)\n", c, med, m, v[1], v[m]
		}
	}' "$WORK/rows"
