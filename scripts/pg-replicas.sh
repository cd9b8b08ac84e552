#!/usr/bin/env bash
# pg-replicas.sh: REPLICAS serve replicas on one PostgreSQL, c64 reserves
# on one hot subject spread over them (bench --addrs), for two binaries in
# the same run, interleaved (issue 15: 0 STORE_CONFLICT answers over 60 s,
# throughput not below the revision before the lock wait and the reruns).
#
#   scripts/pg-replicas.sh BASELINE_BINARY BINARY
#
# Per round and binary (which goes first alternates by round): a new
# database (dropdb/createdb NAME_a or NAME_b), REPLICAS servers on it
# sharing the first one's shard keys, then BINARY's bench (--addrs over the
# replicas, --subjects 1) for DURATION. Prints per run ops/s, p99, errors
# and the STORE_CONFLICT answers, the server CPU per reserve (all
# replicas, /proc), and per round the ratio BINARY / BASELINE.
#
# Environment: PG (postgres://postgres@127.0.0.1:5432), NAME
# (capledger_replicas), ROUNDS (2), DURATION (60s), CONCURRENCY (64),
# REPLICAS (3), PORT (27591, then the next ones).
set -euo pipefail
A=$1 B=$2
PG=${PG:-postgres://postgres@127.0.0.1:5432} NAME=${NAME:-capledger_replicas}
ROUNDS=${ROUNDS:-2} DURATION=${DURATION:-60s} CONCURRENCY=${CONCURRENCY:-64}
REPLICAS=${REPLICAS:-3} PORT=${PORT:-27591}
host=${PG#*://}; user=${host%%@*}; host=${host#*@}; port=${host#*:}; host=${host%%:*}
WORK=$(mktemp -d)
TICK=$(getconf CLK_TCK)
SERVERS=()
stop() { for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; SERVERS=(); }
trap 'stop; rm -rf "$WORK"' EXIT
ticks() { local t=0 p; for p in "${SERVERS[@]}"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done; echo $t; }
run() { # label binary -> "ops/s p99_ms errors conflicts cpu_us"
	local db=${NAME}_$1 bin=$2 addrs=() i
	dropdb -U "$user" -h "$host" -p "$port" --if-exists "$db"
	createdb -U "$user" -h "$host" -p "$port" "$db"
	mkdir -p "$WORK/$1"
	for i in $(seq 0 $((REPLICAS - 1))); do
		# The first replica creates the shard keys; the others share them.
		keys=(); ((i == 0)) || keys=(--shard-keys "$WORK/$1/r0/shard-keys")
		"$bin" serve --addr "127.0.0.1:$((PORT + i))" --data-dir "$WORK/$1/r$i" "${keys[@]}" \
			--store "$PG/$db?sslmode=disable" --log-level warn >"$WORK/$1/r$i.log" 2>&1 &
		SERVERS+=($!)
		for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((PORT + i))") 2>/dev/null && break; sleep 0.1; done
		addrs+=("http://127.0.0.1:$((PORT + i))")
	done
	local t0 t1
	t0=$(ticks)
	"$B" bench --addrs "$(IFS=,; echo "${addrs[*]}")" --subjects 1 --concurrency "$CONCURRENCY" \
		--duration "$DURATION" --progress=false >"$WORK/out" 2>&1 || true
	t1=$(ticks)
	stop
	awk -v d=$((t1 - t0)) -v tick="$TICK" '
		$1 == "ops" { ops = $2 } $1 == "ops/s" { rate = $2 } $1 == "errors" && NF == 2 { errs = $2 }
		$1 == "errors" && $2 == "STORE_CONFLICT" { conf = $3 }
		$1 == "p99" { p99 = $2; if ($3 == "s") p99 *= 1000; else if ($3 == "µs") p99 /= 1000 }
		END { printf "%.0f %.1f %d %d %.0f\n", rate, p99, errs, conf, (ops > 0 ? d / tick * 1e6 / ops : 0) }' "$WORK/out"
}
echo "# $REPLICAS replicas, c$CONCURRENCY on one hot subject, $DURATION; A=$A B=$B; $(uptime)"
for r in $(seq "$ROUNDS"); do
	order=(a b); ((r % 2)) || order=(b a)
	declare -A res=()
	for l in "${order[@]}"; do
		bin=$A; [[ $l == b ]] && bin=$B
		res[$l]=$(run "$l" "$bin")
		read -r rate p99 errs conf cpu <<<"${res[$l]}"
		echo "round $r $l ($(basename "$bin")): $rate ops/s, p99 $p99 ms, errors $errs, STORE_CONFLICT $conf, server cpu $cpu µs/op; load $(cut -d' ' -f1-3 /proc/loadavg)"
	done
	read -r ra _ <<<"${res[a]}"; read -r rb _ <<<"${res[b]}"
	awk -v a="$ra" -v b="$rb" -v r="$r" 'BEGIN { printf "round %d: throughput b/a %.2f\n", r, (a > 0 ? b / a : 0) }'
done
