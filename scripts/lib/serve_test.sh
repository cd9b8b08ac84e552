#!/usr/bin/env bash
# scripts/lib/serve_test.sh BINARY: checks scripts/lib/serve.sh against a
# real `BINARY serve` over loopback HTTP (and, for a server that never gets
# ready or ignores SIGTERM, a small python3 stand-in). Prints one line per
# case and exits 1 when one fails.
#
# Environment: PORT (47590; it uses PORT..PORT+2).
set -euo pipefail
BIN=${1:?usage: scripts/lib/serve_test.sh BINARY}
PORT=${PORT:-47590}
# shellcheck source=scripts/lib/serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/serve.sh"
WORK=$(mktemp -d)
HOLDER=
trap '[[ -z $HOLDER ]] || kill "$HOLDER" 2>/dev/null; serve_stop; rm -rf "$WORK"' EXIT
failed=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1: $2"; failed=1; }
owner() { # port -> pid listening on it (ss)
	ss -Hltnp "( sport = :$1 )" | sed -n 's/.*pid=\([0-9]*\),.*/\1/p' | head -1
}

# 1. A free port: ready on return, the answer is the started server's, and
# SIGTERM stops it with status 0 and nothing on stderr.
name="starts, answers /readyz 200 on return, stops cleanly"
if serve_start "127.0.0.1:$PORT" "$WORK/1.log" "$BIN" --data-dir "$WORK/1" 2>"$WORK/1.err"; then
	code=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/readyz") || true
	pid=$SERVE_PID listener=$(owner "$PORT")
	serve_stop "$SERVE_PID" 2>>"$WORK/1.err"
	if [[ $code != 200 ]]; then fail "$name" "/readyz answered $code"
	elif [[ $listener != "$pid" ]]; then fail "$name" "port $PORT held by pid '$listener', started $pid"
	elif kill -0 "$pid" 2>/dev/null; then fail "$name" "pid $pid still runs after serve_stop"
	elif [[ -s $WORK/1.err ]]; then fail "$name" "stderr: $(cat "$WORK/1.err")"
	elif ! grep -q 'msg=stopped' "$WORK/1.log"; then fail "$name" "no graceful stop in the log: $(tail -2 "$WORK/1.log")"
	elif [[ -n $SERVE_PID || ${#SERVE_PIDS[@]} != 0 ]]; then fail "$name" "still tracked: '$SERVE_PID' (${SERVE_PIDS[*]})"
	else pass "$name"; fi
else
	fail "$name" "serve_start failed: $(cat "$WORK/1.err")"
fi

# 2. The port held for 3 s by a socket that connects out from it (as a
# connection to PostgreSQL from an ephemeral port does): serve exits with
# "address already in use" and serve_start starts it again.
name="retries while an outgoing connection holds the port"
# A socket of an earlier run in TIME_WAIT would keep the holder from binding.
for _ in $(seq 70); do [[ -n $(ss -Htan "( sport = :$((PORT + 1)) )") ]] || break; sleep 1; done
# SO_LINGER 0: its close resets, leaving no TIME_WAIT for the next run.
python3 -c '
import socket, struct, sys, time
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); s.bind(("127.0.0.1", int(sys.argv[1]))); s.connect(srv.getsockname())
print("held", flush=True); time.sleep(3)' "$((PORT + 1))" >"$WORK/holder.out" 2>&1 &
HOLDER=$!
for _ in $(seq 50); do grep -q held "$WORK/holder.out" && break; sleep 0.1; done
t0=$SECONDS
if serve_start "127.0.0.1:$((PORT + 1))" "$WORK/2.log" "$BIN" --data-dir "$WORK/2" 2>"$WORK/2.err"; then
	pid=$SERVE_PID listener=$(owner $((PORT + 1)))
	serve_stop "$SERVE_PID"
	if ((SECONDS - t0 < 2)); then fail "$name" "ready after $((SECONDS - t0)) s: the port was not held (holder: $(cat "$WORK/holder.out"))"
	elif [[ $listener != "$pid" ]]; then fail "$name" "port held by pid '$listener', started $pid"
	else pass "$name"; fi
else
	fail "$name" "serve_start failed: $(cat "$WORK/2.err")"
fi
wait "$HOLDER" 2>/dev/null || true
HOLDER=

# 3. Another server already listens on the port: refused at once, nothing
# started (a probe would have read the other server's answer).
name="refuses a port another server listens on"
python3 -m http.server --bind 127.0.0.1 "$((PORT + 2))" >"$WORK/other.log" 2>&1 </dev/null &
HOLDER=$!
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$((PORT + 2))/" && break; sleep 0.1; done
t0=$SECONDS
if serve_start "127.0.0.1:$((PORT + 2))" "$WORK/3.log" "$BIN" --data-dir "$WORK/3" 2>"$WORK/3.err"; then
	fail "$name" "serve_start returned 0 (pid $SERVE_PID)"
	serve_stop
elif ! grep -q "already listens on port $((PORT + 2))" "$WORK/3.err"; then fail "$name" "stderr: $(cat "$WORK/3.err")"
elif [[ -e $WORK/3.log || ${#SERVE_PIDS[@]} != 0 ]]; then fail "$name" "a serve was started"
elif ((SECONDS - t0 > 1)); then fail "$name" "took $((SECONDS - t0)) s"
else pass "$name"; fi
kill "$HOLDER"; wait "$HOLDER" 2>/dev/null || true
HOLDER=

# 4. serve refuses its flags: its exit status and log on stderr, no retry.
name="reports a serve that exits at start"
if serve_start "127.0.0.1:$PORT" "$WORK/4.log" "$BIN" --data-dir "$WORK/4" --cache-rows 0 2>"$WORK/4.err"; then
	fail "$name" "serve_start returned 0"
	serve_stop
elif ! grep -q "exited 1 (start 1 of 5)" "$WORK/4.err" || ! grep -q -- "--cache-rows 0" "$WORK/4.err"; then fail "$name" "stderr: $(cat "$WORK/4.err")"
else pass "$name"; fi

# 5. A stand-in that answers /readyz 503 and ignores SIGTERM: serve_start
# gives up after SERVE_WAIT with the answer, and stopping it takes SIGKILL.
# (SERVE_WAIT 5: python3 may take 1.5 s to start here.)
cat >"$WORK/fake" <<'PY'
#!/usr/bin/env python3
import http.server, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
host, port = sys.argv[sys.argv.index("--addr") + 1].rsplit(":", 1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503); self.end_headers(); self.wfile.write(b"not ready: store unavailable: test\n")
    def log_message(self, *a): pass
http.server.HTTPServer((host, int(port)), H).serve_forever()
PY
chmod +x "$WORK/fake"
name="gives up on a server that stays not ready, SIGKILLs one that ignores SIGTERM"
t0=$SECONDS
if SERVE_WAIT=5 SERVE_STOP_WAIT=1 serve_start "127.0.0.1:$PORT" "$WORK/5.log" "$WORK/fake" 2>"$WORK/5.err"; then
	fail "$name" "serve_start returned 0"
	serve_stop
elif ! grep -q "within 5s (last: 503, not ready: store unavailable: test)" "$WORK/5.err"; then fail "$name" "stderr: $(cat "$WORK/5.err")"
elif ! grep -q "SIGKILL" "$WORK/5.err"; then fail "$name" "no SIGKILL: $(cat "$WORK/5.err")"
elif [[ -n $(owner "$PORT") ]]; then fail "$name" "the stand-in still listens"
elif ((SECONDS - t0 > 9)); then fail "$name" "took $((SECONDS - t0)) s"
else pass "$name"; fi

exit $failed
