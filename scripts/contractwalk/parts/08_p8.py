import hashlib, struct
def request_digest(subject, route, region, units, estimator_digest="", body_hash=""):
    def s(x):
        b = x.encode("utf-8")
        return struct.pack(">I", len(b)) + b
    region = region or "global"
    names = sorted((n for n, v in units.items() if v != 0), key=lambda n: n.encode("utf-8"))
    enc = s("capledger.requestDigest.v1") + s(subject) + s(route) + s(region)
    enc += struct.pack(">I", len(names))
    for n in names:
        enc += s(n) + struct.pack(">q", units[n])
    enc += s(estimator_digest) + s(body_hash)
    return "sha256:" + hashlib.sha256(enc).hexdigest()
check('worked example', request_digest("tenant-7", "chat.generate", "eu-west", {"tokens": 600, "requests": 1}, "sha256:e57", "sha256:b0d") == 'sha256:7549e55c2efef44af21d83998bf0e6ce35a291f4ed43a77d49a59f85c1057527')
U = {"\uff5a": 1, "\U0001F600": 2, "e\u0301": 3, "\u00e9": 4}
check('unicode example', request_digest("te\u0301nant-7", "chat.generate", "", U) == 'sha256:4550ecd93ed99cf11c86161a336c70ccde004d0aeb5fcfb73481ecd42b5f7566')
# server: publish te\u0301nant-7 policy with those units
RUN = str(int(time.time()))
subj = "te\u0301nant-7" + RUN
call('PublishPolicy', {"policy": {"subject": subj, "route": "chat.generate", "dimensions": [{"unit": k, "burst": 100} for k in U]}})
s, j, h, b = call('Reserve', {"reservationId": "u-" + RUN, "subject": subj, "route": "chat.generate", "units": U})
check('server digest unicode', s == 200 and j['reservation']['requestDigest'] == request_digest(subj, "chat.generate", "", U), b)
# RecordUsage digest example
check('record digest example', 'record:' + request_digest("tenant-7", "chat.generate", "", {}) == 'record:sha256:37251d02c3d3d7b11ed328d387964b6b96a19b04edaa12c8b8fe6dccd08ac9f8')
print('checked', N[0], 'fails', len(FAILS))
