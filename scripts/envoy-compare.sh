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
# Needs redis-server (Debian) and service_cmd on PATH or in $(go env
# GOPATH)/bin: go install github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36
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
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
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
"$CAPLEDGER" serve --addr 127.0.0.1:$((BASE + 4)) --data-dir "$WORK/data" --envoy-config "$WORK/mapping.yaml" >"$WORK/serve.log" 2>&1 &
PIDS+=($!); CAP_PID=$!
"$CAPLEDGER" serve --addr 127.0.0.1:$((BASE + 5)) --data-dir "$WORK/data-nethttp" --envoy-config "$WORK/mapping.yaml" \
	--grpc-transport net/http >"$WORK/serve-nethttp.log" 2>&1 &
PIDS+=($!); NET_PID=$!
for p in $((BASE + 1)) $((BASE + 4)) $((BASE + 5)); do
	for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.1; done
done
row() { sed -n "s#^$2   *\([^ ]*\).*#\1#p" "$1" | head -1; }
ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done; echo $t; }
TICK=$(getconf CLK_TCK)
setup=true setup_net=true
echo "round	c	system	checks/s	p50 ms	p99 ms	srv µs/check	cli µs/check	errors	load"
for r in $(seq "$ROUNDS"); do
	for c in $CONCURRENCIES; do
		for sys in $SYSTEMS; do
			if [[ $sys == capledger ]]; then
				addr=http://127.0.0.1:$((BASE + 4)) pids=($CAP_PID) extra="--setup=$setup"
				setup=false
			elif [[ $sys == capledger-nethttp ]]; then
				addr=http://127.0.0.1:$((BASE + 5)) pids=($NET_PID) extra="--setup=$setup_net"
				setup_net=false
			else
				addr=http://127.0.0.1:$((BASE + 1)) pids=($RL_PID $REDIS_PID) extra=--setup=false
			fi
			k0=$(ticks "${pids[@]}") t0=$(date +%s.%N)
			"$CAPLEDGER" bench --mode envoy --progress=false --addr "$addr" $extra --concurrency $c --duration "$DURATION" --warmup "$WARMUP" >"$WORK/out" 2>&1 || { cat "$WORK/out" "$WORK/rl.log"; exit 1; }
			k1=$(ticks "${pids[@]}") t1=$(date +%s.%N)
			rate=$(row "$WORK/out" "ops/s")
			srv=$(awk -v d=$((k1 - k0)) -v tick="$TICK" -v t0="$t0" -v t1="$t1" -v rate="$rate" 'BEGIN { printf "%.1f", d / tick * 1e6 / (rate * (t1 - t0)) }')
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$c" "$sys" "$rate" "$(row "$WORK/out" p50)" "$(row "$WORK/out" p99)" "$srv" "$(row "$WORK/out" "client cpu/op")" "$(row "$WORK/out" errors)" "$(cut -d' ' -f1 /proc/loadavg)"
		done
	done
done
