PORT = PORT2
RUN = str(int(time.time())) + 't'
ST = 'tenant-a/ret' + RUN
s, j, h, b = call('PublishPolicy', {"policy": {"subject": ST, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 100}]}}); g = j['policy']['generation']
R = lambda m, body: call(m, body, token=GWA)
R('Reserve', {"reservationId": "s" + RUN, "subject": ST, "route": "chat.generate", "units": {"tokens": 10}})
R('Start', {"reservationId": "s" + RUN, "operationId": "o"}); R('Settle', {"reservationId": "s" + RUN, "operationId": "o", "actualUnits": {"tokens": 10}})
R('Reserve', {"reservationId": "l" + RUN, "subject": ST, "route": "chat.generate", "units": {"tokens": 10}}); R('Release', {"reservationId": "l" + RUN})
R('RecordUsage', {"reservationId": "u" + RUN, "operationId": "o", "subject": ST, "route": "chat.generate", "actualUnits": {"tokens": 5}})
# Retention (1 s, a pass every 200 ms) retires all three; poll rather
# than sleep a fixed 3 s, which a loaded machine's passes can overrun.
retired = lambda res: res[0] == 200 and (res[1] or {}).get('reservation', {}).get('retired') is True
for rid in ('s', 'l', 'u'):
    poll(lambda: R('GetReservation', {"reservationId": rid + RUN}), retired, 60)
s, j, h, b = R('GetReservation', {"reservationId": "s" + RUN}); print('get tomb', b[:400])
check('tombstone receipt retired', s == 200 and j['reservation'].get('retired') is True and j['reservation']['state'] == 'RESERVATION_STATE_SETTLED' and 'reservedUnits' not in j['reservation'] and 'finishedAt' in j['reservation'], b[:400])
s, j, h, b = R('Reserve', {"reservationId": "s" + RUN, "subject": ST, "route": "chat.generate", "units": {"tokens": 10}})
check('tomb Reserve same digest replay', s == 200 and j.get('replayed') is True and j['reservation'].get('retired') is True, b[:300]); print('tomb reserve', b[:300])
expect('tomb Reserve other digest', R('Reserve', {"reservationId": "s" + RUN, "subject": ST, "route": "chat.generate", "units": {"tokens": 11}}), 409, 'already_exists', 'DIGEST_MISMATCH')
s, j, h, b = R('Settle', {"reservationId": "s" + RUN, "operationId": "o", "actualUnits": {"tokens": 10}})
expect('tomb Settle settled -> ALREADY_SETTLED', (s, j, h, b), 400, 'failed_precondition', 'RESERVATION_ALREADY_SETTLED'); print('tomb settle', b[:400])
expect('tomb Start -> ALREADY_SETTLED', R('Start', {"reservationId": "s" + RUN, "operationId": "o"}), 400, 'failed_precondition', 'RESERVATION_ALREADY_SETTLED')
expect('tomb Mark -> ALREADY_SETTLED', R('MarkUsageUnknown', {"reservationId": "s" + RUN}), 400, 'failed_precondition', 'RESERVATION_ALREADY_SETTLED')
expect('tomb Release settled -> ALREADY_SETTLED', R('Release', {"reservationId": "s" + RUN}), 400, 'failed_precondition', 'RESERVATION_ALREADY_SETTLED')
s, j, h, b = R('Release', {"reservationId": "l" + RUN})
check('tomb Release released -> replay', s == 200 and j.get('replayed') is True and 'refundedUnits' not in j, b[:300])
expect('tomb Settle released', R('Settle', {"reservationId": "l" + RUN, "operationId": "o", "actualUnits": {"tokens": 1}}), 400, 'failed_precondition', 'RESERVATION_RELEASED')
expect('tomb Start released', R('Start', {"reservationId": "l" + RUN, "operationId": "o"}), 400, 'failed_precondition', 'RESERVATION_RELEASED')
s, j, h, b = R('RecordUsage', {"reservationId": "u" + RUN, "operationId": "zz", "subject": ST, "route": "chat.generate", "actualUnits": {"tokens": 99}})
check('tomb RecordUsage same id/subject replays whatever usage', s == 200 and j.get('replayed') is True and j.get('policyGeneration') == g and j['reservation'].get('retired') is True and 'actualUnits' not in j['reservation'] and 'operationId' not in j['reservation'], b[:400]); print('tomb record', b[:400])
expect('tomb RecordUsage other route', R('RecordUsage', {"reservationId": "u" + RUN, "operationId": "o", "subject": ST, "route": "chat.other", "actualUnits": {"tokens": 5}}), 409, 'already_exists', 'DIGEST_MISMATCH')
expect('tomb RecordUsage on reserve id', R('RecordUsage', {"reservationId": "s" + RUN, "operationId": "o", "subject": ST, "route": "chat.generate", "actualUnits": {"tokens": 10}}), 409, 'already_exists', 'DIGEST_MISMATCH')
s, j, h, b = R('Settle', {"reservationId": "u" + RUN, "operationId": "o", "actualUnits": {"tokens": 5}})
print('tomb settle of a record', s, b[:300])
s, j, h, b = call('ListSubjectReservations', {"subject": ST}, svc='ConsoleService'); print('LSR retained', b[:300])
check('LSR retained count', s == 200 and j.get('retained') in ('3', 3), b[:300])
s, j, h, b = call('Audit', {}); check('audit clean after retention', s == 200 and not j.get('discrepancies'), b[:500])
print('waiting for tombstone horizon'); time.sleep(20)
s, j, h, b = poll(lambda: R('GetReservation', {"reservationId": "s" + RUN}), lambda res: res[0] == 404, 60)
check('after horizon 404', s == 404, b[:200])
s, j, h, b = R('Reserve', {"reservationId": "s" + RUN, "subject": ST, "route": "chat.generate", "units": {"tokens": 11}})
check('after horizon new admission', s == 200 and 'replayed' not in j, b[:200])
s, j, h, b = call('Audit', {}); check('audit clean after horizon', s == 200 and not j.get('discrepancies'), b[:500])
PORT = PORT1
print('checked', N[0], 'fails', len(FAILS))
