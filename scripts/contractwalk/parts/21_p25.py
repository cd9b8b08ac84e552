RUN = str(int(time.time())) + 'r'
SL = 'tenant-a/life' + RUN
s, j, h, b = call('PublishPolicy', {"policy": {"subject": SL, "route": "chat.generate", "emergencyMode": True, "dimensions": [{"unit": "tokens", "burst": 100, "refillUnits": 1, "refillInterval": "1000s"}]}})
g = j['policy']['generation']
TWO53 = 9007199254740992
s, j, h, b = call('IssueShard', {"shardId": "big" + RUN, "subject": SL, "route": "chat.generate", "units": {"tokens": str(TWO53 + 1)}, "gatewayId": "gw-a", "bootEpoch": 1, "ttl": "60s"}, svc='ShardService')
expect('IssueShard > 2^53 too large', (s, j, h, b), 429, 'resource_exhausted', 'RESERVATION_TOO_LARGE'); check('no retry-after', 'retry-after' not in h, h)
s, j, h, b = call('RecordUsage', {"reservationId": "lu0" + RUN, "operationId": "o", "subject": SL, "route": "chat.generate", "actualUnits": {"tokens": str(TWO53)}})
check('record 2^53', s == 200, b[:300])
s, j, h, b = call('Reserve', {"reservationId": "lr" + RUN, "subject": SL, "route": "chat.generate", "units": {"tokens": 1}})
print('frozen huge debt', s, h.get('retry-after'), b[:400])
check('Retry-After capped 9223372036', h.get('retry-after') == '9223372036' and j['details'][0]['debug'].get('retryAfter') == '9223372036s', (h.get('retry-after'), b[:300]))
ok = 1
for i in range(1, 40):
    s, j, h, b = call('RecordUsage', {"reservationId": "lu%d" % i + RUN, "operationId": "o", "subject": SL, "route": "chat.generate", "actualUnits": {"tokens": str(TWO53)}})
    if s != 200:
        print('refused at', i, s, b[:400]); break
    ok += 1
check('lifetime: 32 records of 2^53 fit, 33rd refused', ok == 32 and s == 400 and reason(j) == 'ACCOUNT_LIFETIME_EXHAUSTED' and j.get('code') == 'failed_precondition', (ok, s, b[:300]))
s, j, h, b = call('Audit', {}); check('audit clean after lifetime', s == 200 and not j.get('discrepancies'), b[:600])
print('checked', N[0], 'fails', len(FAILS))
