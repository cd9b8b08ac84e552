import random
RUN = str(int(time.time())) + 'i'
random.seed(int(time.time()))
cases = []
for k in range(6):
    subj = 'tenant-a/ra%d-%s' % (k, RUN)
    ti = random.choice(['0.7s', '0.3s', '1.3s', '0.05s']); ri = random.choice(['0.9s', '2.1s', '0.4s'])
    tu = random.randint(1, 7); ru = random.randint(1, 2)
    call('PublishPolicy', {"policy": {"subject": subj, "route": "chat.generate", "dimensions": [
        {"unit": "tokens", "burst": 100, "refillUnits": tu, "refillInterval": ti},
        {"unit": "requests", "burst": 10, "refillUnits": ru, "refillInterval": ri}]}})
    # spend most
    rid = 'x%d' % k
    call('Reserve', {"reservationId": rid + RUN, "subject": subj, "route": "chat.generate", "units": {"tokens": 95, "requests": 9}})
    call('Start', {"reservationId": rid + RUN, "operationId": "o"})
    extra = random.choice([0, 0, 20])
    call('Settle', {"reservationId": rid + RUN, "operationId": "o", "actualUnits": {"tokens": 95 + extra, "requests": 9}})
    want = {"tokens": random.randint(10, 40), "requests": random.randint(2, 5)}
    s, j, h, b = call('Reserve', {"reservationId": 'y%d' % k + RUN, "subject": subj, "route": "chat.generate", "units": want})
    d = j['details'][0]['debug'] if s == 429 else {}
    print(k, ti, tu, ri, ru, 'extra', extra, want, s, h.get('retry-after'), d.get('limitingDimension'), d.get('reason'))
    cases.append((k, subj, want, int(h.get('retry-after', '0')), time.time(), d))
    # also compute expected
for k, subj, want, ra, t0, d in cases:
    pass
maxra = max(c[3] for c in cases)
start = min(c[4] for c in cases)
for k, subj, want, ra, t0, d in sorted(cases, key=lambda c: c[4] + c[3]):
    now = time.time(); due = t0 + ra
    if due > now: time.sleep(due - now + 0.02)
    s, j, h, b = call('Reserve', {"reservationId": 'y%d' % k + RUN, "subject": subj, "route": "chat.generate", "units": want})
    check('Retry-After promise case %d (ra %d)' % (k, ra), s == 200, (b[:300], d))
print('checked', N[0], 'fails', len(FAILS))
