# shellcheck shell=bash
# scripts/lib/serve.sh: start `capledger serve` for a script, wait until it
# is ready, and stop it. Sourced by the scripts in scripts/ (bash 4.3 or
# newer):
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib/serve.sh"
#   serve_start 127.0.0.1:47500 "$WORK/serve.log" "$BIN" --data-dir "$WORK/data" || exit 1
#   ... "$SERVE_PID" is the server's pid ...
#   serve_stop "$SERVE_PID"    # or serve_stop: every server still running
#
# serve_start ADDR LOG BINARY [SERVE_FLAG...]
#   Runs `BINARY serve --addr ADDR SERVE_FLAG...` in the background, its
#   stdout and stderr to LOG (truncated), stdin from /dev/null, and returns
#   0 once GET http://ADDR/readyz answers 200 (docs/API.md: the last store
#   transaction worked and the store answers a read now), with the
#   server's pid in SERVE_PID. ADDR is HOST:PORT; an empty or 0.0.0.0 host
#   is probed on 127.0.0.1.
#   - It waits for an HTTP answer, not an open port: serve listens before
#     it opens its store (so the port opens before it can answer), and a
#     TCP probe from an ephemeral port equal to PORT connects to itself
#     and then holds the port.
#   - When serve exits because the port is taken ("address already in use"
#     in LOG), it starts it again 2 s later, up to SERVE_TRIES (5) starts in
#     all: ports inside Linux's ephemeral range (ip_local_port_range,
#     32768-60999 by default) are also handed to outgoing connections, e.g.
#     to PostgreSQL, and such a connection may hold the port for a moment.
#   - Before each start it refuses (returns 1, starts nothing) when
#     something already listens on PORT (ss, when installed): the probe
#     would read that server's answer.
#   - It waits at most SERVE_WAIT (60) seconds per start: migrations on a
#     loaded machine, or a large store's first open, take a while.
#   On failure it prints why on stderr (serve's exit status or /readyz's
#   last answer, and LOG's last lines), stops what it started and returns
#   1; SERVE_PID is then empty. Call it in the shell that stops the server,
#   not inside $(...): the server is that shell's child.
#
# serve_stop [PID...]
#   Stops the servers serve_start started (without PIDs: every one still
#   running): SIGTERM (serve stops accepting, lets in-flight requests and
#   their batches commit, then closes the store), up to SERVE_STOP_WAIT
#   (30) seconds for it to exit, then SIGKILL. A server that exits other
#   than 0, or needs SIGKILL, is named on stderr with its log's last line.
#   Always returns 0, so it fits an EXIT trap.

SERVE_PID=
SERVE_PIDS=()
declare -gA SERVE_LOGS=()

serve_start() {
	if (($# < 3)); then
		echo "serve_start: usage: serve_start ADDR LOG BINARY [SERVE_FLAG...]" >&2
		return 2
	fi
	local addr=$1 log=$2 bin=$3
	shift 3
	local port=${addr##*:} host=${addr%:*} probe
	probe=$addr
	[[ -n $host && $host != 0.0.0.0 ]] || probe=127.0.0.1:$port
	local tries=${SERVE_TRIES:-5} wait=${SERVE_WAIT:-60} try pid code status deadline body
	SERVE_PID=
	for ((try = 1; ; try++)); do
		if command -v ss >/dev/null && [[ -n $(ss -Hltn "( sport = :$port )" 2>/dev/null) ]]; then
			echo "serve_start: something already listens on port $port; not starting $bin serve --addr $addr" >&2
			return 1
		fi
		"$bin" serve --addr "$addr" "$@" >"$log" 2>&1 </dev/null &
		pid=$!
		SERVE_PIDS+=("$pid")
		SERVE_LOGS[$pid]=$log
		deadline=$((SECONDS + wait))
		code=
		while kill -0 "$pid" 2>/dev/null; do
			# --noproxy: an http_proxy in the environment must not
			# answer for the loopback.
			code=$(curl -s --noproxy '*' --max-time 2 -o /dev/null -w '%{http_code}' "http://$probe/readyz" 2>/dev/null) || true
			if [[ $code == 200 ]]; then
				SERVE_PID=$pid
				return 0
			fi
			if ((SECONDS >= deadline)); then
				body=$(curl -s --noproxy '*' --max-time 2 "http://$probe/readyz" 2>/dev/null | head -3) || true
				echo "serve_start: $bin serve --addr $addr did not answer /readyz with 200 within ${wait}s (last: ${code:-no answer}${body:+, $body}); its log $log ends:" >&2
				tail -5 "$log" >&2
				serve_stop "$pid"
				return 1
			fi
			sleep 0.1
		done
		status=0
		wait "$pid" 2>/dev/null || status=$?
		serve_forget "$pid"
		if grep -q "address already in use" "$log" && ((try < tries)); then
			sleep 2
			continue
		fi
		echo "serve_start: $bin serve --addr $addr exited $status (start $try of $tries); its log $log ends:" >&2
		tail -5 "$log" >&2
		return 1
	done
}

serve_stop() {
	local pids=("$@") pid status
	((${#pids[@]})) || pids=("${SERVE_PIDS[@]}")
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		local deadline=$((SECONDS + ${SERVE_STOP_WAIT:-30}))
		while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "serve_stop: serve (pid $pid) still running ${SERVE_STOP_WAIT:-30}s after SIGTERM: SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
		status=0
		wait "$pid" 2>/dev/null || status=$?
		# 127: not this shell's child (or already waited for).
		if ((status != 0 && status != 127)); then
			echo "serve_stop: serve (pid $pid) exited $status${SERVE_LOGS[$pid]:+; its log ${SERVE_LOGS[$pid]} ends: $(tail -1 "${SERVE_LOGS[$pid]}" 2>/dev/null)}" >&2
		fi
		serve_forget "$pid"
	done
	for pid in "${pids[@]}"; do
		[[ $pid != "$SERVE_PID" ]] || SERVE_PID=
	done
	return 0
}

# serve_forget PID: drops PID from the servers serve_stop stops.
serve_forget() {
	local keep=() p
	for p in "${SERVE_PIDS[@]}"; do
		[[ $p == "$1" ]] || keep+=("$p")
	done
	SERVE_PIDS=("${keep[@]}")
	unset "SERVE_LOGS[$1]"
}
