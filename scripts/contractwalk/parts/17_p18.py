RUN = str(int(time.time())) + 'o'
SO = 'tenant-a/ord' + RUN
s, j, h, b = call('PublishPolicy', {"policy": {"subject": SO, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 100}]}}); g = j['policy']['generation']
call('Reserve', {"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"tokens": 10}})
call('Start', {"reservationId": "o1" + RUN, "operationId": "op"})
call('Settle', {"reservationId": "o1" + RUN, "operationId": "op", "actualUnits": {"tokens": 10}})
expect('settle settled w/ negative -> INVALID_COMMAND', call('Settle', {"reservationId": "o1" + RUN, "operationId": "op", "actualUnits": {"tokens": -1}}), 400, 'invalid_argument', 'INVALID_COMMAND')
expect('settle settled no op -> INVALID_COMMAND', call('Settle', {"reservationId": "o1" + RUN, "actualUnits": {"tokens": 1}}), 400, 'invalid_argument', 'INVALID_COMMAND')
expect('reserve used id with 0 units -> INVALID_COMMAND', call('Reserve', {"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"tokens": 0}}), 400, 'invalid_argument', 'INVALID_COMMAND')
expect('reserve used id record: digest -> INVALID_COMMAND', call('Reserve', {"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"tokens": 10}, "requestDigest": "record:x"}), 400, 'invalid_argument', 'INVALID_COMMAND')
expect('reserve used id unknown unit -> DIGEST_MISMATCH', call('Reserve', {"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"gpus": 10}}), 409, 'already_exists', 'DIGEST_MISMATCH')
expect('reserve used id too large -> DIGEST_MISMATCH', call('Reserve', {"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"tokens": 1000}}), 409, 'already_exists', 'DIGEST_MISMATCH')
s, j, h, b = call('Reserve', {"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"tokens": 10}})
check('reserve replay of settled', s == 200 and j.get('replayed') is True and j['reservation']['state'] == 'RESERVATION_STATE_SETTLED', b[:300])
# rollback, then replay
call('RollbackPolicy', {"generation": g})
s, j, h, b = call('Reserve', {"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"tokens": 10}})
check('replay after rollback', s == 200 and j.get('replayed') is True and j.get('policyGeneration') == g, b[:300])
s, j, h, b = call('ReserveBatch', {"requests": [{"reservationId": "o1" + RUN, "subject": SO, "route": "chat.generate", "units": {"tokens": 10}}]})
check('batch replay after rollback', s == 200 and j['outcomes'][0].get('ok', {}).get('replayed') is True, b[:300])
# RecordUsage on id used, after rollback
s, j, h, b = call('RecordUsage', {"reservationId": "o1" + RUN, "operationId": "op", "subject": SO, "route": "chat.generate", "actualUnits": {"tokens": 10}})
expect('RecordUsage on reserve id after rollback', (s, j, h, b), 409, 'already_exists', 'DIGEST_MISMATCH')
# 415/404/501 without token
s, j, h, b = call('Reserve', {}, token=None, headers={'Content-Type': 'text/plain'}); check('415 without token', s == 415, (s, b))
s, j, h, b = call('Reserv', {}, token=None); check('404 without token', s == 404, (s, b))
s, j, h, b = call('Reserve', {}, token=None, headers={'Content-Encoding': 'br'}); check('501 without token', s == 501, (s, b))
# shape before auth-role? viewer malformed reserve -> 403 (auth first)
s, j, h, b = call('Reserve', {"reservationId": ""}, token=VIEW); check('auth role before shape', s == 403, (s, b))
# IssueShard with other gw id invalid -> 400 before 403
s, j, h, b = call('IssueShard', {"shardId": "x", "gatewayId": "a\u0000b", "subject": SO, "route": "chat.generate", "units": {"tokens": 1}, "bootEpoch": 1, "ttl": "1s"}, token=GWA, svc='ShardService')
check('gatewayId invalid 400 before 403', s == 400, (s, b[:300]))
s, j, h, b = call('IssueShard', {"shardId": "", "gatewayId": "gw-b", "subject": SO, "route": "chat.generate", "units": {"tokens": 1}, "bootEpoch": 1, "ttl": "1s"}, token=GWA, svc='ShardService')
check('other gw id (shape bad) -> 403 first', s == 403, (s, b[:300]))
# Reserve shape vs scope: out-of-scope subject with bad shape -> 400
s, j, h, b = call('Reserve', {"reservationId": "", "subject": "tenant-z/x", "route": "chat.generate", "units": {"tokens": 1}}, token=GWB)
check('shape before scope', s == 400 and reason(j) == 'INVALID_COMMAND', (s, b[:300]))
print('checked', N[0], 'fails', len(FAILS))
