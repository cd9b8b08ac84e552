c = http.client.HTTPConnection('127.0.0.1', PORT, timeout=10)
def go(name, method, path, body, headers):
    h = {'Authorization': 'Bearer ' + ADMIN, 'Content-Type': 'application/json'}
    h.update(headers)
    for k in [k for k, v in h.items() if v is None]: del h[k]
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse(); b = r.read()
        print('%-28s %d close=%s' % (name, r.status, r.getheader('Connection')))
    except Exception as e:
        print('%-28s EXC %s' % (name, e)); c.close()
P = '/capledger.v1.LedgerService/'
seq = [
 ('401', 'POST', P + 'GetPolicy', b'{"generation":1}', {'Authorization': None}),
 ('400 malformed', 'POST', P + 'GetPolicy', b'{x', {}),
 ('404 unknown method', 'POST', P + 'Nope', b'{}', {}),
 ('415', 'POST', P + 'GetPolicy', b'{}', {'Content-Type': 'text/plain'}),
 ('405', 'PUT', P + 'GetPolicy', b'{}', {}),
 ('413 small', 'POST', P + 'GetPolicy', b'{"generation":1}' + b' ' * (1 << 20), {}),
 ('413 2MiB', 'POST', P + 'GetPolicy', b'{"generation":1}' + b' ' * (2 << 20), {}),
 ('501 br', 'POST', P + 'GetPolicy', b'{}', {'Content-Encoding': 'br'}),
 ('400 timeout hdr', 'POST', P + 'GetPolicy', b'{}', {'Connect-Timeout-Ms': 'x'}),
 ('504 timeout 0', 'POST', P + 'GetPolicy', b'{"generation":1}', {'Connect-Timeout-Ms': '0'}),
 ('400 invalid utf8', 'POST', P + 'GetPolicy', b'{"x":"\xff"}', {}),
 ('200', 'POST', P + 'GetPolicy', b'{"generation":1}', {}),
]
for s in seq: go(*s)
