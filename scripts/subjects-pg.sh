#!/usr/bin/env bash
# subjects-pg.sh: issue 15's many-subjects windows on PostgreSQL: reserves
# over SUBJECTS random subjects against HOT subjects, alternating in the
# same run, on one seeded database, through REPLICAS serve replicas.
#
#   DB=NAME [REPLICAS=1] [MODE=batch HOT=10 CONCURRENCY=8] \
#     flock /work/bench.lock scripts/subjects-pg.sh BINARY
#
# DB is a database seeded once (not under the lock; it is not copied, so
# the windows' own holds stay in it, a few percent of the seed):
#   createdb -h 127.0.0.1 -U postgres NAME
#   capledger serve --store postgres://postgres@127.0.0.1:5432/NAME \
#     --retention 0 --compaction 0 --addr 127.0.0.1:PORT &
#   capledger bench --addr http://127.0.0.1:PORT --subjects 1000000 \
#     --mode batch --concurrency 8 --epoch-length 24h --duration 1s
#   psql -h 127.0.0.1 -U postgres NAME -c "UPDATE reservations SET
#     expires_at = expires_at + 604800000000000 WHERE state = 1"
#   psql -h 127.0.0.1 -U postgres NAME -c "VACUUM (ANALYZE)"
# (due_at is generated from expires_at; the week keeps the expiry worker
# out of the windows; each run first pushes earlier runs' holds, which
# last the bench policy's hour, a week out as well.)
# Then: REPLICAS servers on DB (retention and compaction off, the workers
# on; the first one's shard keys shared), a WARMUP over SUBJECTS, and
# PAIRS pairs of windows, SUBJECTS and HOT alternating (which comes first
# alternates by pair), each window's bench with a new --seed so it draws
# new subjects. Every window prints reservations/s, p99, errors, CPU
# per reservation (user + system from /proc over the window, divided by
# the reservations) of the servers and of PostgreSQL: the backends
# connected to DB plus the shared checkpointer, background writer and
# walwriter (which other databases' writers may also keep busy; a backend
# that exits inside a window loses its ticks). Each pair prints its ratios.
#
# Environment: PG (postgres://postgres@127.0.0.1:5432), DB (required),
# REPLICAS (1), SUBJECTS (1000000), HOT (1), MODE (reserve, or batch: one
# ReserveBatch of BATCH per op), BATCH (100), CONCURRENCY (64), PAIRS (3),
# DURATION (12s), WARMUP (15s), PORT (47400, then the next ones),
# SERVE_FLAGS (added to every server), PPROF (a host:port: the first
# replica serves its profiles there; PROFILE=FILE then records a CPU
# profile of the first SUBJECTS window into FILE; PERF=FILE a perf record
# of DB's PostgreSQL processes over the same window).
#
# Each capledger serve starts through scripts/lib/serve.sh: again when its
# port is taken, used only once its /readyz answers 200, stopped with
# SIGTERM; one that does not get ready within a minute stops the script.
set -euo pipefail
BIN=${1:?usage: DB=NAME scripts/subjects-pg.sh BINARY}
: "${DB:?DB names a seeded database}"
PG=${PG:-postgres://postgres@127.0.0.1:5432} REPLICAS=${REPLICAS:-1}
SUBJECTS=${SUBJECTS:-1000000} HOT=${HOT:-1} MODE=${MODE:-reserve} BATCH=${BATCH:-100}
CONCURRENCY=${CONCURRENCY:-64} PAIRS=${PAIRS:-3} DURATION=${DURATION:-12s}
WARMUP=${WARMUP:-15s} PORT=${PORT:-47400}
WORK=$(mktemp -d)
TICK=$(getconf CLK_TCK)
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
SERVERS=() ADDRS=()
trap 'serve_stop; wait 2>/dev/null; rm -rf "$WORK"' EXIT
ticks() { local t=0 p; for p in "${SERVERS[@]}"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done; echo $t; }
pgsnap() { # "pid ticks" of DB's backends and the shared writers
	local p cmd
	for p in $(pgrep -x postgres); do
		{ cmd=$(tr '\0' ' ' <"/proc/$p/cmdline"); } 2>/dev/null || continue
		case $cmd in
		*" $DB "* | *checkpointer* | *"background writer"* | *walwriter*)
			awk -v p="$p" '{ print p, $14 + $15 }' "/proc/$p/stat" 2>/dev/null || true ;;
		esac
	done
}
pgstat() { # DB's blocks read outside shared_buffers, the cluster's WAL bytes and full-page images
	psql -h "$host" -p "$pgport" -U "$user" -AtF' ' -c "SELECT (SELECT blks_read FROM pg_stat_database WHERE datname = current_database()), wal_bytes, wal_fpi FROM pg_stat_wal" "$DB"
}
pgticks() { # before-file after-file -> ticks between (a new pid counts from 0)
	awk 'NR == FNR { t0[$1] = $2; next } { d += $2 - ($1 in t0 ? t0[$1] : 0) } END { print d + 0 }' "$1" "$2"
}
bench() { # subjects duration [extra flags]
	local s=$1 d=$2; shift 2
	"$BIN" bench --addrs "$(IFS=,; echo "${ADDRS[*]}")" --setup=false --prefill=false --subjects "$s" \
		--mode "$MODE" --batch-size "$BATCH" --concurrency "$CONCURRENCY" --duration "$d" \
		--warmup 0s --progress=false --seed "$((RANDOM * 32768 + RANDOM))" "$@"
}
window() { # subjects -> "reservations/s p99_ms errors server_us pg_us reads wal_bytes fpi" (per reservation)
	local t0 t1 s0 s1 prof=
	s0=$(pgstat); t0=$(ticks); pgsnap >"$WORK/pg0"
	if [[ -n ${PROFILE:-} && -n ${PPROF:-} && $1 == "$SUBJECTS" && ! -e $PROFILE ]]; then
		curl -s -o "$PROFILE" "http://$PPROF/debug/pprof/profile?seconds=${DURATION%s}" &
		prof=$!
		if [[ -n ${PERF:-} ]]; then
			perf record -q -o "$PERF" -p "$(awk '{ print $1 }' "$WORK/pg0" | paste -sd,)" -- sleep "${DURATION%s}" >/dev/null 2>&1 &
			prof="$prof $!"
		fi
	fi
	bench "$1" "$DURATION" >"$WORK/out" 2>&1 || true
	t1=$(ticks); pgsnap >"$WORK/pg1"; sleep 1; s1=$(pgstat)
	# shellcheck disable=SC2086
	[[ -z $prof ]] || wait $prof || true
	awk -v d=$((t1 - t0)) -v pd="$(pgticks "$WORK/pg0" "$WORK/pg1")" -v tick="$TICK" -v s0="$s0" -v s1="$s1" \
		-v per="$([[ $MODE == batch ]] && echo "$BATCH" || echo 1)" '
		$1 == "ops" { ops = $2 * per } $1 == "ops/s" { rate = $2 * per } $1 == "reservations/s" { rate = $2 }
		$1 == "errors" && NF == 2 { errs = $2 }
		$1 == "p99" { p99 = $2; if ($3 == "s") p99 *= 1000; else if ($3 == "µs") p99 /= 1000 }
		END { split(s0, a, " "); split(s1, b, " "); if (ops == 0) ops = 1e-9
			printf "%.0f %.1f %d %.0f %.0f %.2f %.0f %.2f\n", rate, p99, errs, d / tick * 1e6 / ops, pd / tick * 1e6 / ops,
				(b[1] - a[1]) / ops, (b[2] - a[2]) / ops, (b[3] - a[3]) / ops }' "$WORK/out"
}
host=${PG#*://}; user=${host%%@*}; host=${host#*@}; pgport=${host#*:}; host=${host%%:*}
# Earlier runs' holds (the bench policy's hour) pushed a week out too.
psql -h "$host" -p "$pgport" -U "$user" -qAtc "UPDATE reservations SET expires_at = expires_at + 604800000000000
	WHERE state = 1 AND expires_at < (extract(epoch FROM now()) * 1e9)::bigint + 86400000000000" "$DB"
echo "# DB=$DB REPLICAS=$REPLICAS SUBJECTS=$SUBJECTS HOT=$HOT MODE=$MODE BATCH=$BATCH CONCURRENCY=$CONCURRENCY DURATION=$DURATION $(basename "$BIN"); $(uptime)"
for i in $(seq 0 $((REPLICAS - 1))); do
	flags=(); ((i == 0)) || flags=(--shard-keys "$WORK/r0/shard-keys")
	[[ $i != 0 || -z ${PPROF:-} ]] || flags+=(--pprof-addr "$PPROF")
	# serve_start retries a port an outgoing connection holds (the ports
	# are inside Linux's ephemeral range, and the kernel hands out
	# neighbouring ports to connections to one PostgreSQL) and waits up
	# to a minute for /readyz (migrations on a loaded machine). Stop
	# rather than measure fewer replicas.
	# shellcheck disable=SC2086
	serve_start "127.0.0.1:$((PORT + i))" "$WORK/r$i.log" "$BIN" --data-dir "$WORK/r$i" "${flags[@]}" \
		--store "$PG/$DB?sslmode=disable" --retention 0 --compaction 0 --log-level warn \
		${SERVE_FLAGS:-} || { echo "serve r$i did not start" >&2; exit 1; }
	SERVERS+=("$SERVE_PID")
	ADDRS+=("http://127.0.0.1:$((PORT + i))")
done
bench "$SUBJECTS" "$WARMUP" >/dev/null 2>&1 || true
for p in $(seq "$PAIRS"); do
	if ((p % 2)); then
		many=$(window "$SUBJECTS"); hot=$(window "$HOT")
	else
		hot=$(window "$HOT"); many=$(window "$SUBJECTS")
	fi
	read -r mr mp me mc mg mb mw mf <<<"$many"
	read -r hr hp he hc hg hb hw hf <<<"$hot"
	awk -v p="$p" -v mr="$mr" -v hr="$hr" -v mc="$mc" -v hc="$hc" -v mg="$mg" -v hg="$hg" -v me="$me" -v he="$he" \
		-v mp="$mp" -v hp="$hp" -v ld="$(cut -d' ' -f1-3 /proc/loadavg)" -v s="$SUBJECTS" -v h="$HOT" \
		-v mb="$mb" -v hb="$hb" -v mw="$mw" -v hw="$hw" -v mf="$mf" -v hf="$hf" \
		'BEGIN { fmt = "%s %s/s p99 %s ms err %s cpu %s+%s µs reads %s wal %s B fpi %s"
			printf "pair %d: " fmt " | " fmt " | ratio %.2f, server cpu %.2fx, pg cpu %.2fx | load %s\n",
			p, s, mr, mp, me, mc, mg, mb, mw, mf, h, hr, hp, he, hc, hg, hb, hw, hf,
			(hr > 0 ? mr / hr : 0), (hc > 0 ? mc / hc : 0), (hg > 0 ? mg / hg : 0), ld }'
done
for i in $(seq 0 $((REPLICAS - 1))); do
	[[ ! -s $WORK/r$i.log ]] || { echo "# r$i log:"; tail -5 "$WORK/r$i.log"; }
done
