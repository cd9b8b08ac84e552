import struct
st = STATE; S, G = st['S'], st['G']
RUN = str(int(time.time())) + 'k'
def gw(method, msg, ct='application/grpc-web+json', token=ADMIN, svc='LedgerService', text=False, extra=None):
    payload = json.dumps(msg).encode() if 'json' in ct else msg
    frame = b'\x00' + struct.pack('>I', len(payload)) + payload
    if text: frame = base64.b64encode(frame)
    h = {'Content-Type': ct, 'Authorization': 'Bearer ' + token} if token else {'Content-Type': ct}
    if extra: h.update(extra)
    c = http.client.HTTPConnection('127.0.0.1', PORT, timeout=20)
    c.request('POST', '/capledger.v1.%s/%s' % (svc, method), body=frame, headers=h)
    r = c.getresponse(); b = r.read(); hd = dict((k.lower(), v) for k, v in r.getheaders()); c.close()
    if text: b = base64.b64decode(b) if b else b
    msgs = []; trailers = {}
    i = 0
    while i + 5 <= len(b):
        flag = b[i]; n = struct.unpack('>I', b[i+1:i+5])[0]; body = b[i+5:i+5+n]; i += 5 + n
        if flag & 0x80:
            for line in body.decode().split('\r\n'):
                if ':' in line: k, v = line.split(':', 1); trailers[k.strip().lower()] = v.strip()
        else: msgs.append(body)
    return r.status, hd, msgs, trailers, b
subj = 'tenant-a/gw' + RUN
call('PublishPolicy', {"policy": {"subject": subj, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 10, "refillUnits": 1, "refillInterval": "1s"}]}})
s, hd, msgs, tr, b = gw('Reserve', {"reservationId": "g1" + RUN, "subject": subj, "route": "chat.generate", "units": {"tokens": 8}})
print('gw ok', s, hd.get('content-type'), msgs[:1], tr)
check('grpc-web+json reserve ok', s == 200 and tr.get('grpc-status') == '0' and msgs, (s, tr))
s, hd, msgs, tr, b = gw('Reserve', {"reservationId": "g2" + RUN, "subject": subj, "route": "chat.generate", "units": {"tokens": 5}})
print('gw 429', s, hd, tr)
st_ = tr.get('grpc-status') or hd.get('grpc-status'); ra = tr.get('retry-after') or hd.get('retry-after')
check('grpc-web 429: status 8, no retry-after past burst - reserved', st_ == '8' and ra is None, (hd, tr))
s, hd, msgs, tr, b = gw('Reserve', {"reservationId": "g3" + RUN, "subject": subj, "route": "chat.generate", "units": {"tokens": 5}}, ct='application/grpc-web-text+json', text=True)
print('gwtext 429', s, hd, tr)
st_ = tr.get('grpc-status') or hd.get('grpc-status'); ra = tr.get('retry-after') or hd.get('retry-after')
check('grpc-web-text 429: status 8, no retry-after', st_ == '8' and ra is None, (hd, tr))
s, hd, msgs, tr, b = gw('Reserve', {"reservationId": "g4" + RUN, "subject": subj, "route": "chat.generate", "units": {"tokens": 5}, "bogus": 1})
st_ = tr.get('grpc-status') or hd.get('grpc-status')
print('gw unknown field', s, hd, tr)
check('grpc-web unknown field 3', st_ == '3' and 'unknown field' in urllib.parse.unquote(tr.get('grpc-message') or hd.get('grpc-message', '')), (hd, tr))
s, hd, msgs, tr, b = gw('Reserve', {"reservationId": "", "subject": subj, "route": "chat.generate", "units": {"tokens": 5}})
st_ = tr.get('grpc-status') or hd.get('grpc-status'); m = urllib.parse.unquote(tr.get('grpc-message') or hd.get('grpc-message', ''))
check('grpc-web invalid cmd msg', st_ == '3' and m == 'reservationId is required', (hd, tr))
s, hd, msgs, tr, b = gw('Audit', {}, token=GW)
st_ = tr.get('grpc-status') or hd.get('grpc-status'); check('grpc-web 403 -> 7', st_ == '7', (s, hd, tr))
s, hd, msgs, tr, b = gw('Audit', {}, token=None)
st_ = tr.get('grpc-status') or hd.get('grpc-status'); check('grpc-web 401 -> 16', st_ == '16', (s, hd, tr))
# Connect JSON with charset
s, j, h, b = call('GetPolicy', {"generation": G}, headers={'Content-Type': 'application/json; charset=utf-8'})
check('json; charset=utf-8', s == 200, b[:200])
# body over limit on grpc-web
big = {"reservationId": "a" * (1 << 20)}
s, hd, msgs, tr, b = gw('Reserve', big)
print('gw big', s, hd, tr, b[:300])
print('checked', N[0], 'fails', len(FAILS))
