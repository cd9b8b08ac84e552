import re, gzip, socket
st = STATE; S, G, RUN = st['S'], st['G'], st['RUN'] + 'e'
body = json.dumps({"generation": G}).encode()
s, j, h, b = call('GetPolicy', None, raw=gzip.compress(body), headers={'Content-Encoding': 'gzip'})
check('gzip request accepted', s == 200, b[:200])
s, j, h, b = call('GetPolicy', None, raw=body, headers={'Accept-Encoding': 'gzip'})
print('  accept gzip -> content-encoding', h.get('content-encoding'))
q = urllib.parse.quote(json.dumps({"generation": G}))
s, j, h, b = call('GetPolicy', None, http_method='GET', path='/capledger.v1.LedgerService/GetPolicy?encoding=json&compression=br&message=' + q)
expect('GET compression=br 501', (s, j, h, b), 501, 'unimplemented', None, 'unknown compression "br": supported encodings are gzip', nodetail=True)
s, j, h, b = call('GetPolicy', None, http_method='GET', path='/capledger.v1.LedgerService/GetPolicy?encoding=json&base64=1&compression=gzip&message=' + base64.urlsafe_b64encode(gzip.compress(body)).decode().rstrip('='))
check('GET compression=gzip base64 ok', s == 200, (s, b[:300]))
s, j, h, b = call('GetPolicy', None, raw=b'\x08\x01', headers={'Content-Type': 'application/proto'}, token=None)
check('binary error body is JSON', s == 401 and h.get('content-type', '').startswith('application/json') and j and j.get('code') == 'unauthenticated', (s, h, b))
s, j, h, b = call('x', None, http_method='HEAD', path='/healthz', token=None)
check('HEAD /healthz 200', s == 200, s)
for v in ('-1', '12345678901', '1.5'):
    s, j, h, b = call('GetPolicy', {"generation": G}, headers={'Connect-Timeout-Ms': v})
    expect('Connect-Timeout-Ms %r 400' % v, (s, j, h, b), 400, 'invalid_argument', None, 'parse timeout:', 'prefix', nodetail=True)
s, j, h, b = call('GetPolicy', {"generation": G}, headers={'Connect-Timeout-Ms': '1234567890'})
check('10 digits ok', s == 200, b[:200])
# chunked over limit
def chunked(path, payload, extra=b''):
    c = socket.create_connection(('127.0.0.1', PORT))
    req = b'POST ' + path.encode() + b' HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer ' + ADMIN.encode() + b'\r\nTransfer-Encoding: chunked\r\n' + extra + b'\r\n'
    c.sendall(req)
    step = 65536
    try:
        for i in range(0, len(payload), step):
            part = payload[i:i + step]
            c.sendall(b'%x\r\n' % len(part) + part + b'\r\n')
        c.sendall(b'0\r\n\r\n')
    except Exception as e:
        pass
    c.settimeout(10); data = b''
    try:
        while True:
            d = c.recv(65536)
            if not d: break
            data += d
            if b'\r\n\r\n' in data and (b'}' in data.split(b'\r\n\r\n', 1)[1]): break
    except Exception: pass
    c.close(); return data
d = chunked('/capledger.v1.LedgerService/Reserve', b'{"reservationId":"' + b'a' * (1 << 20) + b'"}')
print('  chunked', d[:400])
check('chunked over limit 413 wording', d.startswith(b'HTTP/1.1 413') and b'chunked request body is larger than' in d, d[:300])
s, j, h, b = call('Reserve', None, raw=b'{"reservationId":"' + b'a' * (1 << 20) + b'"}')
expect('sized over limit 413', (s, j, h, b), 413, 'resource_exhausted', None, 'request body of %d bytes is larger than the limit of 1048576 bytes' % (len(b'{"reservationId":""}') + (1 << 20)), nodetail=True)
print('  413 retry-after?', h.get('retry-after'))
gz = gzip.compress(b'{"reservationId":"' + b'a' * (1 << 20) + b'"}')
s, j, h, b = call('Reserve', None, raw=gz, headers={'Content-Encoding': 'gzip'})
expect('gzip over limit 413', (s, j, h, b), 413, 'resource_exhausted', None, 'request body is larger than', 'prefix', nodetail=True)
print('  ', b)
gzq = base64.urlsafe_b64encode(gzip.compress(json.dumps({"reservationId": "a" * 1100000}).encode())).decode().rstrip('=')
s, j, h, b = call('GetReservation', None, http_method='GET', path='/capledger.v1.LedgerService/GetReservation?encoding=json&base64=1&compression=gzip&message=' + gzq)
expect('GET gzip over limit 413', (s, j, h, b), 413, 'resource_exhausted', None, 'request message is larger than', 'prefix', nodetail=True)
print('  ', s, b[:300])
# Header too large -> 431
s, j, h, b = call('GetReservation', None, http_method='GET', path='/capledger.v1.LedgerService/GetReservation?encoding=json&message=' + urllib.parse.quote(json.dumps({"reservationId": "a" * 70000})))
check('431 on big GET', s == 431 and b.startswith(b'431 Request Header Fields Too Large'), (s, b[:200]))
# 415
s, j, h, b = call('Reserve', {}, headers={'Content-Type': 'text/plain'})
check('415 Accept-Post', s == 415 and b == b'' and 'application/grpc-web-text' in h.get('accept-post', '') and 'application/proto' in h.get('accept-post', ''), (s, h))
print('  accept-post', h.get('accept-post'))
s, j, h, b = call('Reserve', {}, headers={'Content-Type': 'application/json; charset=utf-8'})
print('  json; charset=utf-8 ->', s, b[:200])
s, j, h, b = call('Reserv', {})
expect('unknown method 404 unimplemented', (s, j, h, b), 404, 'unimplemented', None, 'no method or endpoint at /capledger.v1.LedgerService/Reserv', 'prefix')
s, j, h, b = call('x', None, path='/nothing/here')
print('  /nothing/here', s, b[:200])
s, j, h, b = call('x', None, http_method='GET', path='/metrics', token=None)
check('/metrics has capledger_commands_total', s == 200 and b'capledger_commands_total' in b, s)
for line in b.decode().splitlines():
    if line.startswith('capledger_commands_total') and ('reserve' in line): print('  ', line)
print('checked', N[0], 'fails', len(FAILS))
