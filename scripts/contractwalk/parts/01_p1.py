import re
RUN = str(int(time.time()))
S = 'tenant-a/s' + RUN
pol = {"policy": {"subject": S, "route": "chat.generate", "dimensions": [
    {"unit": "tokens", "burst": 1000, "refillUnits": 10, "refillInterval": "1s"},
    {"unit": "requests", "burst": 10, "refillUnits": 1, "refillInterval": "1s"}], "holdTtl": "1.5s"}}
s, j, h, b = call('PublishPolicy', pol)
check('publish 200', s == 200, b)
p = j['policy']; G = p['generation']
check('publish generation is string', isinstance(G, str), p)
check('schema admissionBudget.v1', p.get('schema') == 'admissionBudget.v1', p)
check('region default global', p.get('region') == 'global', p)
check('holdTtl 1.5s reads 1.500s', p.get('holdTtl') == '1.500s', p)
check('epochLength default 3600s', p.get('epochLength') == '3600s', p)
check('fairnessWeight default 1 (reads back as 1)', p.get('fairnessWeight') in ('1', 1), p)
check('fairnessBudget default 0.05', p.get('fairnessBudget') == 0.05, p)
check('active true', p.get('active') is True, p)
check('publishedAt RFC3339 UTC', re.match(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$', p.get('publishedAt', '')), p)
check('maxReservation default burst', all(d.get('maxReservation') == d.get('burst') for d in p['dimensions']), p['dimensions'])
print('policy', json.dumps(p))
# replay
s, j, h, b = call('PublishPolicy', pol)
check('publish again replayed', s == 200 and j.get('replayed') is True and j['policy']['generation'] == G, b)
# publish with server fields ignored
pol2 = json.loads(json.dumps(pol)); pol2['policy'].update(generation="999", active=False, rolledBack=True, publishedAt="2000-01-01T00:00:00Z")
s, j, h, b = call('PublishPolicy', pol2)
check('server fields ignored on publish (replay)', s == 200 and j.get('replayed') is True and j['policy']['generation'] == G, b)
# GetPolicy
s, j, h, b = call('GetPolicy', {"generation": G})
check('GetPolicy ok', s == 200 and j['policy']['generation'] == G, b)
check('GetPolicy rolloutNow set for active', j['policy'].get('rolloutNow') == 'ROLLOUT_MODE_ENFORCE', j)
expect('GetPolicy 0 invalid', call('GetPolicy', {"generation": 0}), 400, 'invalid_argument')
expect('GetPolicy {} invalid', call('GetPolicy', {}), 400, 'invalid_argument')
expect('GetPolicy unknown', call('GetPolicy', {"generation": "99999999"}), 404, 'not_found', 'POLICY_NOT_FOUND', 'policy generation not found: 99999999')
# Connect GET
q = urllib.parse.quote(json.dumps({"generation": G}))
s, j, h, b = call('GetPolicy', None, http_method='GET', path='/capledger.v1.LedgerService/GetPolicy?encoding=json&message=' + q)
check('Connect GET GetPolicy 200 + no-store', s == 200 and h.get('cache-control') == 'no-store', (s, h, b[:200]))
s, j, h, b = call('GetPolicy', None, http_method='GET', path='/capledger.v1.LedgerService/GetPolicy?encoding=xml&message=' + q)
check('Connect GET encoding=xml 415', s == 415 and b == b'', (s, b))
s, j, h, b = call('GetPolicy', None, http_method='GET', path='/capledger.v1.LedgerService/GetPolicy?message=' + q)
check('Connect GET no encoding 415', s == 415, (s, b))
s, j, h, b = call('Reserve', None, http_method='GET', path='/capledger.v1.LedgerService/Reserve?encoding=json&message=%7B%7D')
check('GET write method 405 Allow POST', s == 405 and h.get('allow') == 'POST' and b == b'', (s, h, b))
s, j, h, b = call('GetPolicy', None, http_method='PUT', path='/capledger.v1.LedgerService/GetPolicy')
check('PUT read method 405 Allow POST, GET?', s == 405 and 'POST' in h.get('allow', '') and 'GET' in h.get('allow', ''), (s, h, b))
s, j, h, b = call('GetPolicy', None, http_method='OPTIONS', path='/capledger.v1.LedgerService/GetPolicy')
check('OPTIONS 405, no ACAO', s == 405 and not any(k.startswith('access-control') for k in h), (s, h, b))
s, j, h, b = call('x', None, http_method='DELETE', path='/healthz')
check('DELETE /healthz 405 Allow GET, HEAD', s == 405 and h.get('allow') == 'GET, HEAD' and len(b) > 0 and b.count(b'\n') <= 1, (s, h, b))
s, j, h, b = call('x', None, http_method='GET', path='/healthz', token=None)
check('/healthz 200 ok', s == 200 and b.strip() == b'ok', (s, b))
s, j, h, b = call('x', None, http_method='GET', path='/readyz', token=None)
check('/readyz 200 ready', s == 200 and b.strip().startswith(b'ready'), (s, b))
s, j, h, b = call('x', None, http_method='GET', path='/statusz', token=None)
check('/statusz json fields', s == 200 and j and 'ready' in j and 'workers' in j and j['workers'].get('leader') is True and j['workers'].get('fence') in (1, '1'), b[:500])
print('statusz', b[:800])
# Reserve
def rsv(rid, units, subj=S, route='chat.generate', tok=GWA, **kw):
    d = {"reservationId": rid, "subject": subj, "route": route, "units": units}; d.update(kw)
    return call('Reserve', d, token=tok)
R1 = 'r1-' + RUN
s, j, h, b = rsv(R1, {"tokens": 600})
check('reserve 200', s == 200, b)
r = j['reservation']
print('reserve', json.dumps(j))
check('reservation schema', r.get('schema') == 'limitReservation.v1', r)
check('state RESERVED', r.get('state') == 'RESERVATION_STATE_RESERVED', r)
check('reservedUnits names every unit incl "0"', r.get('reservedUnits') == {"requests": "0", "tokens": "600"}, r)
check('policyGeneration at top', j.get('policyGeneration') == G, j)
check('reservation policyGeneration', r.get('policyGeneration') == G, r)
check('no replayed on first', 'replayed' not in j, j)
check('region global', r.get('region') == 'global', r)
check('requestDigest sha256:', r.get('requestDigest', '').startswith('sha256:') and len(r['requestDigest']) == 71, r)
for k in ('createdAt', 'expiresAt', 'accountingEpoch'):
    check('time %s RFC3339 UTC' % k, re.match(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$', r.get(k, '')), r)
check('startedAt omitted', 'startedAt' not in r and 'finishedAt' not in r, r)
from datetime import datetime
def pt(x):
    x = x.rstrip('Z')
    if '.' in x:
        a, f = x.split('.'); x = a + '.' + (f + '000000')[:6]
        return datetime.strptime(x, '%Y-%m-%dT%H:%M:%S.%f')
    return datetime.strptime(x, '%Y-%m-%dT%H:%M:%S')
check('expiresAt = createdAt + holdTtl', abs((pt(r['expiresAt']) - pt(r['createdAt'])).total_seconds() - 1.5) < 0.001, r)
check('accountingEpoch hour start', r['accountingEpoch'].endswith(':00:00Z'), r)
# digest computed by the server equals the CLIENTS.md canonical form
import hashlib, struct
def enc_s(x): x = x.encode(); return struct.pack('>I', len(x)) + x
def digest(subject, route, region, units, est='', body=''):
    e = enc_s('capledger.requestDigest.v1') + enc_s(subject) + enc_s(route) + enc_s(region or 'global')
    us = sorted([(k.encode(), v) for k, v in units.items() if v != 0])
    e += struct.pack('>I', len(us))
    for k, v in us: e += struct.pack('>I', len(k)) + k + struct.pack('>q', v)
    e += enc_s(est) + enc_s(body)
    return 'sha256:' + hashlib.sha256(e).hexdigest()
check('server digest = canonical', r['requestDigest'] == digest(S, 'chat.generate', '', {"tokens": 600}), (r['requestDigest'], digest(S, 'chat.generate', '', {"tokens": 600})))
# replay, same digest given explicitly, units as string, explicit region
s, j, h, b = rsv(R1, {"tokens": "600", "requests": 0}, region='global', requestDigest=digest(S, 'chat.generate', 'global', {"tokens": 600}))
check('replay with own canonical digest', s == 200 and j.get('replayed') is True, b)
s, j, h, b = rsv(R1, {"tokens": 6e2})
check('replay with 6e2', s == 200 and j.get('replayed') is True, b)
s, j, h, b = call('Reserve', {"reservation_id": R1, "subject": S, "route": "chat.generate", "units": {"tokens": 600}}, token=GWA)
check('snake_case accepted on input', s == 200 and j.get('replayed') is True, b)
s, j, h, b = expect('same id other digest 409', rsv(R1, {"tokens": 601}), 409, 'already_exists', 'DIGEST_MISMATCH')
if j: check('DIGEST_MISMATCH detail has no reservation', 'reservation' not in j['details'][0]['debug'], j)
print('digest mismatch', b)
STATE.update({"S": S, "G": G, "R1": R1, "RUN": RUN})
print('checked', N[0], 'fails', len(FAILS))
