RUN = str(int(time.time())) + 'q'
SH = 'tenant-a/shadow' + RUN
s, j, h, b = call('PublishPolicy', {"policy": {"subject": SH, "route": "chat.shadow", "rollout": "ROLLOUT_MODE_SHADOW", "dimensions": [{"unit": "tokens", "burst": 10, "refillUnits": 1, "refillInterval": "1s"}]}}); g = j['policy']['generation']
s, j, h, b = call('Reserve', {"reservationId": "s1" + RUN, "subject": SH, "route": "chat.shadow", "units": {"tokens": 8}, "legacyDecision": "allow"}, token=GWA)
print('s1', b[:300])
s, j, h, b = call('Reserve', {"reservationId": "s2" + RUN, "subject": SH, "route": "chat.shadow", "units": {"tokens": 3}, "legacyDecision": "allow"}, token=GWA)
print('s2', s, h.get('retry-after'), b[:600])
check('shadow rejected 200, no header, no reservation', s == 200 and j.get('shadowRejected') is True and 'reservation' not in j and 'retry-after' not in h and j.get('policyGeneration') == g, b[:400])
check('shadowRejection has reason', j.get('shadowRejection', {}).get('reason') == 'INSUFFICIENT_CAPACITY', j)
s, j, h, b = call('GetReservation', {"reservationId": "s2" + RUN}, token=GWA)
check('shadow rejection stored nothing', s == 404, b[:200])
# Release refundedUnits naming every unit
SR = 'tenant-a/rel' + RUN
call('PublishPolicy', {"policy": {"subject": SR, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 10}, {"unit": "requests", "burst": 10}]}})
call('Reserve', {"reservationId": "rr" + RUN, "subject": SR, "route": "chat.generate", "units": {"tokens": 8}})
s, j, h, b = call('Release', {"reservationId": "rr" + RUN})
check('release refundedUnits every unit', j.get('refundedUnits') == {"requests": "0", "tokens": "8"}, b[:500])
# republish with a third unit; old reservation still shows old generation's units
call('Reserve', {"reservationId": "rr2" + RUN, "subject": SR, "route": "chat.generate", "units": {"tokens": 1}})
call('PublishPolicy', {"policy": {"subject": SR, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 10}, {"unit": "requests", "burst": 10}, {"unit": "gpus", "burst": 10}]}})
s, j, h, b = call('GetReservation', {"reservationId": "rr2" + RUN})
check('old reservation units of its generation', j['reservation']['reservedUnits'] == {"requests": "0", "tokens": "1"}, b[:500])
call('Start', {"reservationId": "rr2" + RUN, "operationId": "o"})
s, j, h, b = call('Settle', {"reservationId": "rr2" + RUN, "operationId": "o", "actualUnits": {"tokens": 1, "gpus": 1}})
print('settle gpus on old gen', s, b[:400])
check('settle with new-gen unit on old gen UNKNOWN_UNIT', s == 400 and reason(j) == 'UNKNOWN_UNIT', b[:300])
# metrics shadow
s, j, h, b = call('x', None, http_method='GET', path='/metrics', token=None)
for line in b.decode().splitlines():
    if line.startswith('capledger_shadow_decisions_total') and 'chat.shadow' in line: print('  ', line)
s, j, h, b = call('ShadowReport', {}, svc='RolloutService')
print('shadow report', b[:800])
print('checked', N[0], 'fails', len(FAILS))
