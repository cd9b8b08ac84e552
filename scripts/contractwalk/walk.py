#!/usr/bin/env python3
"""The contract walk: docs/API.md and docs/CLIENTS.md checked from outside.

A gateway author in another language knows only those two pages; this
script is such a client (Python 3, standard library only: http.client,
json) and checks their promises against a running `capledger serve`:
every RPC's fields and defaults, the Errors table (code, HTTP status,
reason, message, Retry-After), malformed bodies, auth and scopes,
batches, page tokens, time and duration formats, retention's tombstones,
gRPC-Web framing, and the transport limits.

    go build -o /tmp/cw-capledger ./cmd/capledger
    python3 scripts/contractwalk/walk.py /tmp/cw-capledger

It first names the binary (its build time and hash) and warns when this
checkout's Go sources are newer than it: /tmp/cw-capledger is shared, and
a walk of another build answers for that build's code.

It starts two servers of its own on free loopback ports, in a temporary
directory (one with a tokens file, one with a retention window of 1 s),
runs the parts in parts/ in order (they share state), prints a line for
every promise the server broke (MISMATCH name :: what it answered) and
exits 1 if there was one. About a minute and a half: some parts wait for
refill (a Retry-After is a promise, so they wait it out and retry) and
for retention's tombstone horizon.
"""
import base64
import glob
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

TOKENS = """\
s3cr3t-admin-token-000001  admin    ops
s3cr3t-gw-a-token-0000001  gateway  gw-a     subjects=tenant-a/* routes=chat.*
s3cr3t-gw-b-token-0000001  gateway  gw-b     subjects=tenant-b/*
s3cr3t-dash-b-token-00001  viewer   dash-b   subjects=tenant-b/*
s3cr3t-gw-all-token-00001  gateway  gw-all
s3cr3t-view-token-0000001  viewer   view
"""
ADMIN = 's3cr3t-admin-token-000001'
GWA = 's3cr3t-gw-a-token-0000001'
GWB = 's3cr3t-gw-b-token-0000001'
DASHB = 's3cr3t-dash-b-token-00001'
GW = 's3cr3t-gw-all-token-00001'
VIEW = 's3cr3t-view-token-0000001'

FAILS = []
N = [0]
PORT = 0


def call(method, body, token=ADMIN, headers=None, svc='LedgerService', http_method='POST', raw=None, path=None):
    """One request; returns (status, decoded JSON or None, lower-cased headers, raw body)."""
    c = http.client.HTTPConnection('127.0.0.1', PORT, timeout=60)
    h = {'Content-Type': 'application/json'}
    if token:
        h['Authorization'] = 'Bearer ' + token
    for k, v in (headers or {}).items():
        if v is None:
            h.pop(k, None)
        else:
            h[k] = v
    if raw is not None:
        data = raw
    elif body is None:
        data = b''
    else:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    p = path or '/capledger.v1.%s/%s' % (svc, method)
    if http_method == 'GET':
        data = None
        h.pop('Content-Type', None)
    c.request(http_method, p, body=data, headers=h)
    r = c.getresponse()
    b = r.read()
    c.close()
    try:
        j = json.loads(b) if b else None
    except Exception:
        j = None
    return r.status, j, dict((k.lower(), v) for k, v in r.getheaders()), b


def reason(j):
    try:
        return j['details'][0]['debug'].get('reason')
    except Exception:
        return None


def detail_field(j):
    """ErrorDetail.field (3) of an error's first detail, decoded from its
    protobuf value (base64 without padding) as a client in another
    language would, not from debug; '' when absent, None for no detail."""
    try:
        value = j['details'][0]['value']
    except Exception:
        return None
    import base64
    raw = base64.b64decode(value + '=' * (-len(value) % 4))
    i = 0

    def varint():
        nonlocal i
        n = shift = 0
        while True:
            byte = raw[i]
            i += 1
            n |= (byte & 0x7f) << shift
            shift += 7
            if byte < 0x80:
                return n
    while i < len(raw):
        key = varint()
        if key & 7 != 2:  # every ErrorDetail field is length-delimited
            return None
        n = varint()
        if key >> 3 == 3:
            return raw[i:i + n].decode()
        i += n
    return ''


def check(name, cond, info=''):
    N[0] += 1
    if not cond:
        FAILS.append(name)
        print('MISMATCH', name, '::', str(info)[:600])


def expect(name, res, status, code=None, rsn=None, msg=None, match='exact', nodetail=False):
    s, j, h, b = res
    ok = s == status
    if code is not None:
        ok = ok and j is not None and j.get('code') == code
    if rsn is not None:
        ok = ok and reason(j) == rsn
    if msg is not None and j is not None:
        m = j.get('message', '')
        ok = ok and ((m == msg) if match == 'exact' else (m.startswith(msg) if match == 'prefix' else msg in m))
    if nodetail:
        ok = ok and (j is None or 'details' not in j)
    check(name, ok, (s, b[:400]))
    return res


# The JSON fields of the requests whose fields nest, as API.md's method
# sections and the .proto files name them: a name maps to None (a value:
# string, number, Duration, enum, map) or to the fields of the message it
# holds (a list of messages too). A refusal's message starts with a path
# in these (API.md, Errors, "Field paths").
_DIMENSION = dict.fromkeys(['unit', 'refillUnits', 'refillInterval', 'burst', 'maxReservation', 'maxOverdraft'])
_POLICY = dict.fromkeys(['schema', 'subject', 'route', 'region', 'generation', 'estimatorDigest', 'holdTtl', 'executionLimit',
                         'priority', 'fairnessWeight', 'fairnessBudget', 'emergencyMode', 'rollout', 'epochLength',
                         'publishedAt', 'rolledBack', 'active', 'rolloutNow'])
_POLICY['dimensions'] = _DIMENSION
REQUEST_FIELDS = {
    'PublishPolicy': {'policy': _POLICY, 'editedFrom': None},
    'CreateRollout': {'name': None, 'hashBy': None, 'routes': dict.fromkeys(['route', 'region', 'mode'])},
    'ReconcileShard': {'shardId': None, 'gatewayId': None,
                       'receipts': dict.fromkeys(['reservationId', 'state', 'reservedUnits', 'actualUnits'])},
    'IssueShard': dict.fromkeys(['shardId', 'subject', 'route', 'region', 'units', 'gatewayId', 'bootEpoch', 'ttl']),
    'GetRollout': {'name': None},
    'SetRolloutShare': dict.fromkeys(['name', 'percent']),
    'EndRollout': {'name': None},
    'RollbackGenerations': {'generations': None},
    'GetShard': dict.fromkeys(['shardId', 'receiptIds']),
    'GetResolverAnswers': {'reservationIds': None},
}


def leading_path(method, message):
    """The request field path message starts with (API.md, "Field paths"),
    or None when it names none of REQUEST_FIELDS[method]."""
    import re
    m = re.match(r'[a-z][A-Za-z0-9]*(\[[0-9]+\])?(\.[a-z][A-Za-z0-9]*(\[[0-9]+\])?)*(?=[ :]|$)', message or '')
    if not m:
        return None
    fields = REQUEST_FIELDS[method]
    segments = m.group(0).split('.')
    for i, segment in enumerate(segments):
        name = segment.split('[')[0]
        if not isinstance(fields, dict) or name not in fields:
            return None
        if i < len(segments) - 1:
            fields = fields[name]
    return m.group(0)


def poll(fn, done, timeout=60):
    """Calls fn until done(its result) or timeout seconds passed; returns
    the last result. For what a server's worker does on its own schedule
    (retention, tombstone horizons): a fixed sleep was enough on a quiet
    machine and flaky on a loaded one."""
    deadline = time.time() + timeout
    while True:
        res = fn()
        if done(res) or time.time() > deadline:
            return res
        time.sleep(0.2)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start(binary, workdir, name, extra, attempts=5):
    """Starts a server on a free port and waits until it is ready; returns
    the process and its port. free_port's port is free only when it
    answers: another process can take it before the server binds it, so a
    server that exits before it is ready is started again on a new port
    (up to attempts times). One that neither exits nor becomes ready is
    killed, and the walk fails."""
    log = open(os.path.join(workdir, name + '.log'), 'w')
    for attempt in range(1, attempts + 1):
        port = free_port()
        log.write('== walk.py: start %d on port %d\n' % (attempt, port))
        log.flush()
        proc = subprocess.Popen([binary, 'serve', '--addr', '127.0.0.1:%d' % port, '--data-dir', os.path.join(workdir, name),
                                 '--tokens', os.path.join(workdir, 'tokens')] + extra, stdout=log, stderr=subprocess.STDOUT)
        # A minute, not a count of tries: on a loaded CI machine a fresh
        # binary can take seconds to open its store and listen.
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            try:
                c = http.client.HTTPConnection('127.0.0.1', port, timeout=5)
                c.request('GET', '/readyz')
                if c.getresponse().status == 200:
                    return proc, port
            except OSError:
                pass
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            break
        print('%s exited (status %s) before it was ready on port %d: starting it again on another port' % (name, proc.returncode, port))
    raise RuntimeError('%s did not become ready: see %s' % (name, log.name))


def describe(binary):
    """Names the binary walked (its time and hash) and warns when Go sources
    of this checkout are newer: a binary built from another checkout, or
    before the last change, answers for that code, not this one's. (A walk
    of 7 Dec failed 27_bigbodies' 6 checks with a binary built before the
    drain of refused bodies, which the checkout it ran from had.)"""
    import datetime
    import hashlib
    with open(binary, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    built = os.path.getmtime(binary)
    print('binary %s: built %s, sha256 %s' % (binary, datetime.datetime.fromtimestamp(built, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC'), digest))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    newer = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if not d.startswith('.') and d != 'node_modules']
        newer += [os.path.join(root, n) for n in files if n.endswith('.go') and not n.endswith('_test.go') and os.path.getmtime(os.path.join(root, n)) > built]
    if newer:
        print('WARNING: %d Go source files in %s are newer than the binary (%s ...): rebuild it from this checkout' % (len(newer), repo, os.path.relpath(newer[0], repo)))
    sys.stdout.flush()


def main():
    global PORT
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('CAPLEDGER_BIN', '/tmp/cw-capledger')
    describe(binary)
    workdir = tempfile.mkdtemp(prefix='contractwalk-')
    with open(os.path.join(workdir, 'tokens'), 'w') as f:
        f.write(TOKENS)
    procs = []
    walked = False
    # SIGTERM (.ci/run's timeout) ends the walk through the finally below,
    # which stops the servers, instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        # Inside the try: when the second server never becomes ready, the
        # first is stopped all the same.
        main_proc, port1 = start(binary, workdir, 'main', [])
        procs.append(main_proc)
        ret_proc, port2 = start(binary, workdir, 'retention', ['--retention', '1s', '--retention-interval', '200ms', '--tombstone-retention', '20s'])
        procs.append(ret_proc)
        PORT = port1
        ns = globals()
        ns.update(PORT1=port1, PORT2=port2, STATE={})
        for part in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'parts', '*.py'))):
            before = len(FAILS)
            print('==', os.path.basename(part))
            sys.stdout.flush()
            try:
                exec(compile(open(part).read(), part, 'exec'), ns)
            except Exception as e:  # a part that crashes is a mismatch too
                FAILS.append(part)
                print('MISMATCH', os.path.basename(part), 'crashed ::', repr(e)[:400])
            ns['PORT'] = port1
            if len(FAILS) > before:
                print('   %d mismatches in %s' % (len(FAILS) - before, os.path.basename(part)))
        walked = True
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # The servers' logs and stores are kept for a failed walk only.
        if walked and not FAILS:
            shutil.rmtree(workdir, ignore_errors=True)
            where = 'removed'
        else:
            where = 'kept in ' + workdir
        print('%d promises checked, %d broken%s (servers\' logs and data %s)' % (N[0], len(FAILS), '' if walked else ', walk cut short', where))
        sys.stdout.flush()
    sys.exit(1 if FAILS else 0)


if __name__ == '__main__':
    main()
