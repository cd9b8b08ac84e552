#!/usr/bin/env bash
# pg-replicas.sh: REPLICAS serve replicas on one PostgreSQL, c64 reserves
# (on one hot subject unless BENCH says otherwise) spread over them
# (bench --addrs), for two binaries in
# the same run, interleaved (issue 15: 0 STORE_CONFLICT answers over 60 s,
# throughput not below the revision before the lock wait and the reruns).
#
#   scripts/pg-replicas.sh BASELINE_BINARY BINARY
#
# Per round and binary (which goes first alternates by round): a new
# database (dropdb/createdb NAME_a or NAME_b), REPLICAS servers on it
# sharing the first one's shard keys, then BINARY's bench (--addrs over the
# replicas, BENCH) for DURATION. Prints per run ops/s, p99, errors
# and the STORE_CONFLICT answers, the batches the replicas reran after a
# lost race (capledger_conflicts_total: lock timeouts, deadlocks), the
# server CPU per op (all replicas, /proc), the PostgreSQL CPU per op (its
# backends for the run's database, /proc), and per round the ratio
# BINARY / BASELINE.
#
# Environment: PG (postgres://postgres@127.0.0.1:5432), NAME
# (capledger_replicas), ROUNDS (2), DURATION (60s), CONCURRENCY (64),
# REPLICAS (3), PORT (27591, then the next ones), BENCH (the bench's load
# flags, default "--subjects 1"; e.g. "--mode batch --batch-size 100
# --subjects 10"), MIX (flags of a second bench run beside the first, on
# the same replicas, for the same time, started 8 s later with
# --setup=false --warmup 2s, while the first publishes the policy and
# warms up 10 s: its ops/s, errors and conflicts are printed after "mix";
# ops of both count for the CPU per op; the PostgreSQL CPU per op is the
# CPU of the backends connected to the run's database, from /proc, so the
# server must run on this machine), PGSS (set: the server preloads
# pg_stat_statements with track_planning; each run's database gets the
# extension, and planning and execution time per op of its statements
# over the measured time are printed), LOGS (a
# directory: the replicas' logs and the bench outputs are copied there
# as LABEL-rN.log, LABEL-bench.txt and LABEL-mix.txt).
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
A=$1 B=$2
PG=${PG:-postgres://postgres@127.0.0.1:5432} NAME=${NAME:-capledger_replicas}
ROUNDS=${ROUNDS:-2} DURATION=${DURATION:-60s} CONCURRENCY=${CONCURRENCY:-64}
REPLICAS=${REPLICAS:-3} PORT=${PORT:-27591} BENCH=${BENCH:---subjects 1} MIX=${MIX:-}
host=${PG#*://}; user=${host%%@*}; host=${host#*@}; port=${host#*:}; host=${host%%:*}
WORK=$(mktemp -d)
TICK=$(getconf CLK_TCK)
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
SERVERS=()
stop() { serve_stop; SERVERS=(); }
trap 'stop; wait 2>/dev/null; rm -rf "$WORK"' EXIT
ticks() { local t=0 p; for p in "${SERVERS[@]}"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done; echo $t; }
# "pid ticks" of every backend connected to database $1.
pgticks() {
	local p
	for p in $(psql -U "$user" -h "$host" -p "$port" -d "$1" -Atc "SELECT pid FROM pg_stat_activity WHERE datname = '$1' AND pid <> pg_backend_pid()"); do
		[[ -r /proc/$p/stat ]] && echo "$p $(awk '{ print $14 + $15 }' "/proc/$p/stat")"
	done
	return 0
}
run() { # label binary -> "ops/s p99_ms errors conflicts cpu_us"
	local db=${NAME}_$1 bin=$2 addrs=() i
	dropdb -U "$user" -h "$host" -p "$port" --if-exists "$db"
	createdb -U "$user" -h "$host" -p "$port" "$db"
	[[ -z ${PGSS:-} ]] || psql -U "$user" -h "$host" -p "$port" -d "$db" -qc "CREATE EXTENSION pg_stat_statements"
	mkdir -p "$WORK/$1"
	for i in $(seq 0 $((REPLICAS - 1))); do
		# The first replica creates the shard keys; the others share them.
		keys=(); ((i == 0)) || keys=(--shard-keys "$WORK/$1/r0/shard-keys")
		# serve_start retries a port an outgoing connection holds (the
		# ports are inside Linux's ephemeral range, and the kernel hands
		# out neighbouring ports to connections to one PostgreSQL) and
		# waits up to a minute for /readyz: on a loaded machine the first
		# replica's migrations take a while, and the others need its
		# shard keys.
		serve_start "127.0.0.1:$((PORT + i))" "$WORK/$1/r$i.log" "$bin" --data-dir "$WORK/$1/r$i" "${keys[@]}" \
			--store "$PG/$db?sslmode=disable" --log-level warn || { echo "serve r$i did not start" >&2; stop; exit 1; }
		SERVERS+=("$SERVE_PID")
		addrs+=("http://127.0.0.1:$((PORT + i))")
	done
	local t0 t1 mix=
	: >"$WORK/mix"
	if [[ -n $MIX ]]; then
		# shellcheck disable=SC2086
		{ sleep 8; "$B" bench --addrs "$(IFS=,; echo "${addrs[*]}")" --setup=false --warmup 2s $MIX \
			--concurrency "$CONCURRENCY" --duration "$DURATION" --progress=false >"$WORK/mix" 2>&1; } &
		mix=$!
	fi
	local warmup=(); [[ -z $MIX ]] || warmup=(--warmup 10s)
	t0=$(ticks)
	pgticks "$db" >"$WORK/pg0"
	pgss() { [[ -z ${PGSS:-} ]] || psql -U "$user" -h "$host" -p "$port" -d "$db" -Atc "$1"; }
	pgss "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)" >/dev/null
	# shellcheck disable=SC2086
	"$B" bench --addrs "$(IFS=,; echo "${addrs[*]}")" $BENCH "${warmup[@]}" --concurrency "$CONCURRENCY" \
		--duration "$DURATION" --progress=false >"$WORK/out" 2>&1 || true
	[[ -z $mix ]] || wait "$mix" || true
	t1=$(ticks)
	pgticks "$db" >"$WORK/pg1"
	local plan=0 exec=0
	[[ -z ${PGSS:-} ]] || read -r plan exec < <(pgss "SELECT round(COALESCE(sum(total_plan_time), 0) * 1000), round(COALESCE(sum(total_exec_time), 0) * 1000)
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())" | tr '|' ' ')
	# Backends that began after t0 count from 0; those gone by t1 are lost.
	local pgd
	pgd=$(awk 'NR == FNR { t0[$1] = $2; next } { d += $2 - t0[$1] } END { print d + 0 }' "$WORK/pg0" "$WORK/pg1")
	# Store transactions the replicas reran after a lost race (lock
	# timeout, deadlock, duplicate insert), summed over the replicas.
	local a retried=0
	for a in "${addrs[@]}"; do
		retried=$((retried + $(curl -s "$a/metrics" | awk '$1 == "capledger_conflicts_total" { n = $2 } END { printf "%d", n }')))
	done
	stop
	if [[ -n ${LOGS:-} ]]; then
		mkdir -p "$LOGS"
		for i in $(seq 0 $((REPLICAS - 1))); do cp "$WORK/$1/r$i.log" "$LOGS/$1-r$i.log"; done
		cp "$WORK/out" "$LOGS/$1-bench.txt"; [[ -z $MIX ]] || cp "$WORK/mix" "$LOGS/$1-mix.txt"
	fi
	awk -v d=$((t1 - t0)) -v pgd="$pgd" -v plan="$plan" -v exec="$exec" -v tick="$TICK" '
		FNR == 1 { f++ }
		$1 == "ops" { ops += $2 } $1 == "ops/s" { rate[f] = $2 } $1 == "errors" && NF == 2 { errs[f] = $2 }
		$1 == "errors" && $2 == "STORE_CONFLICT" { conf[f] = $3 }
		f == 1 && $1 == "p99" { p99 = $2; if ($3 == "s") p99 *= 1000; else if ($3 == "µs") p99 /= 1000 }
		END { printf "%.0f %.1f %d %d %.0f %.0f %d %d %d %.0f %.1f %.1f\n", rate[1], p99, errs[1], conf[1], (ops > 0 ? d / tick * 1e6 / ops : 0),
			rate[2], errs[2], conf[2], retried, (ops > 0 ? pgd / tick * 1e6 / ops : 0),
			(ops > 0 ? plan / ops : 0), (ops > 0 ? exec / ops : 0) }' retried="$retried" "$WORK/out" "$WORK/mix"
}
echo "# $REPLICAS replicas, c$CONCURRENCY bench $BENCH${MIX:+, beside c$CONCURRENCY bench $MIX}, $DURATION; A=$A B=$B; $(uptime)"
for r in $(seq "$ROUNDS"); do
	order=(a b); ((r % 2)) || order=(b a)
	declare -A res=()
	for l in "${order[@]}"; do
		bin=$A; [[ $l == b ]] && bin=$B
		res[$l]=$(run "$l" "$bin")
		read -r rate p99 errs conf cpu mrate merrs mconf retried pgcpu plan exec <<<"${res[$l]}"
		echo "round $r $l ($(basename "$bin")): $rate ops/s, p99 $p99 ms, errors $errs, STORE_CONFLICT $conf,${MIX:+ mix $mrate ops/s errors $merrs STORE_CONFLICT $mconf,} reruns in the servers $retried, server cpu $cpu µs/op, postgres cpu $pgcpu µs/op${PGSS:+ (planning $plan, execution $exec µs/op)}; load $(cut -d' ' -f1-3 /proc/loadavg)"
	done
	read -r ra _ <<<"${res[a]}"; read -r rb _ <<<"${res[b]}"
	awk -v a="$ra" -v b="$rb" -v r="$r" 'BEGIN { printf "round %d: throughput b/a %.2f\n", r, (a > 0 ? b / a : 0) }'
done
