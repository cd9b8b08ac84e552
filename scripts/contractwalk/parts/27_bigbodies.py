# A client that writes its whole request before reading the answer
# (urllib) reads the refusal of a body over the 1 MiB limit, megabytes
# long: Connect's 413, gRPC-Web's grpc-status 8 (API.md, Limits).
import struct, urllib.request, urllib.error
def post(ct, data):
    req = urllib.request.Request('http://127.0.0.1:%d/capledger.v1.LedgerService/Reserve' % PORT, data=data, headers={'Content-Type': ct, 'Authorization': 'Bearer ' + ADMIN})
    try:
        r = urllib.request.urlopen(req, timeout=60)
        return r.status, r.headers.get('grpc-status')
    except urllib.error.HTTPError as e:
        return e.code, None
    except Exception as e:
        return type(e).__name__ + ': ' + str(e)[:60], None
for size in (1100000, 2 << 20, 4 << 20, 8 << 20):
    got = [post('application/json', b'{"reservationId":"' + b'a' * size + b'"}') for _ in range(3)]
    check('Connect body of %d bytes: 413 for a client that sends it whole' % size, all(g[0] == 413 for g in got), got)
for ct, text in (('application/grpc-web+json', False), ('application/grpc-web-text+json', True)):
    for size in (2 << 20, 6 << 20):
        payload = b'{"reservationId":"' + b'a' * size + b'"}'
        frame = b'\x00' + struct.pack('>I', len(payload)) + payload
        if text:
            frame = base64.b64encode(frame)
        got = post(ct, frame)
        check('%s message of %d bytes: grpc-status 8' % (ct, size), got == (200, '8'), got)
