#!/usr/bin/env bash
# ab.sh: two capledger binaries, interleaved, on the same scenarios:
# server and client CPU µs per reservation (load-insensitive), rate, p99.
#
#   ROUNDS=3 DURATION=3s scripts/ab.sh OLD_BINARY NEW_BINARY [scenario...]
#
# Scenarios: batch-json, batch-connect, c64-connect, c64-grpc, c64-json,
# envoy (--envoy-config of docs/ENVOY.md's benchmark). Each round starts
# a fresh serve per binary (its own data directory) and runs every
# scenario on A, then on B. The server's CPU comes from /proc over the
# run, the client's from bench's own figure.
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
# shellcheck disable=SC2034 # A is read as ${!label}
A=$1 B=$2
shift 2
SCENARIOS=${*:-batch-json batch-connect c64-connect}
ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-3s} WARMUP=${WARMUP:-500ms}
PORT=${PORT:-27391}
WORK=$(mktemp -d)
TICK=$(getconf CLK_TCK)
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
trap 'serve_stop; wait 2>/dev/null; rm -rf "$WORK"' EXIT
cat >"$WORK/envoy.yaml" <<'YAML'
domains:
  - name: bench
    rules:
      - subject: {key: tenant}
        route: {value: bench.reserve}
        unit: tokens
YAML
row() { sed -n "s#^$2   *\([^ ]*\).*#\1#p" "$1" | head -1; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
for r in $(seq "$ROUNDS"); do
	for label in A B; do
		bin=${!label}
		rm -rf "$WORK/data"
		serve_start "127.0.0.1:$PORT" "$WORK/serve.log" "$bin" --data-dir "$WORK/data" --envoy-config "$WORK/envoy.yaml"
		SERVER=$SERVE_PID
		for s in $SCENARIOS; do
			case $s in
			batch-json) args="--mode batch --protocol connect-json" ;;
			batch-connect) args="--mode batch --protocol connect" ;;
			c64-connect) args="--mode reserve --concurrency 64 --protocol connect" ;;
			c64-grpc) args="--mode reserve --concurrency 64 --protocol grpc" ;;
			c64-json) args="--mode reserve --concurrency 64 --protocol connect-json" ;;
			c1-connect) args="--mode reserve --concurrency 1 --protocol connect" ;;
			envoy) args="--mode envoy --concurrency 64" ;;
			envoy-c1) args="--mode envoy --concurrency 1" ;;
			*) echo "unknown scenario $s" >&2; exit 2 ;;
			esac
			out="$WORK/out"
			t0=$(date +%s.%N) k0=$(ticks $SERVER)
			# shellcheck disable=SC2086
			"$B" bench --progress=false --duration "$DURATION" --warmup "$WARMUP" --addr "http://127.0.0.1:$PORT" $args >"$out" 2>&1 || { cat "$out"; exit 1; }
			t1=$(date +%s.%N) k1=$(ticks $SERVER)
			rate=$(row "$out" "reservations/s"); [[ -n $rate ]] || rate=$(row "$out" "ops/s")
			srv=$(awk -v d=$((k1 - k0)) -v tick="$TICK" -v t0="$t0" -v t1="$t1" -v rate="$rate" 'BEGIN { printf "%.1f", d / tick * 1e6 / (rate * (t1 - t0)) }')
			cli=$(awk -v c="$(row "$out" "client cpu/op")" -v ops="$(row "$out" "ops/s")" -v rate="$rate" 'BEGIN { printf "%.1f", c * ops / rate }')
			printf '%s\t%s\t%-14s\t%8s/s\tp99 %8s ms\tsrv %6s µs\tcli %6s µs\terrors %s\tload %s\n' "$r" "$label" "$s" "$rate" "$(row "$out" p99)" "$srv" "$cli" "$(row "$out" errors)" "$(cut -d' ' -f1 /proc/loadavg)"
		done
		serve_stop "$SERVER"
	done
done
