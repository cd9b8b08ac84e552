import struct
def stream(body, tok=ADMIN, ct='application/connect+json', raw=None):
    payload = json.dumps(body).encode()
    data = raw if raw is not None else b'\x00' + struct.pack('>I', len(payload)) + payload
    c = http.client.HTTPConnection('127.0.0.1', PORT, timeout=60)
    h = {'Content-Type': ct}
    if tok: h['Authorization'] = 'Bearer ' + tok
    c.request('POST', '/capledger.v1.AuditService/StreamAudit', body=data, headers=h)
    r = c.getresponse(); b = r.read(); hd = dict((k.lower(), v) for k, v in r.getheaders()); c.close()
    msgs = []; i = 0
    while i + 5 <= len(b):
        flag = b[i]; n = struct.unpack('>I', b[i+1:i+5])[0]; msgs.append((flag, b[i+5:i+5+n])); i += 5 + n
    return r.status, hd, msgs, b
s, hd, msgs, b = stream({"sinceCheckpoint": False})
print(s, hd.get('content-type'), [(f, m[:200]) for f, m in msgs])
check('stream ok, last result then end-stream', s == 200 and msgs and b'"result"' in msgs[-2][1] and msgs[-1][0] == 2, msgs[-2:])
s, hd, msgs, b = stream({"sinceCheckpoint": False}, ct='application/json')
check('stream application/json 415', s == 415, (s, b[:200]))
s, hd, msgs, b = stream({"sinceCheckpoint": False}, tok=GW)
print('gw stream', s, hd.get('content-type'), msgs)
check('stream gateway -> end-stream permission_denied', msgs and msgs[-1][0] == 2 and b'permission_denied' in msgs[-1][1], (s, msgs))
s, hd, msgs, b = stream({"sinceCheckpoint": True, "bogus": 1})
print('bogus', s, msgs)
s, hd, msgs, b = stream(None, raw=b'')
print('empty', s, msgs)
print('checked', N[0], 'fails', len(FAILS))
