st = STATE; S, G = st['S'], st['G']
RUN = str(int(time.time())) + 'm'
R = lambda m, b, tok=ADMIN: call(m, b, svc='RolloutService', token=tok)
s, j, h, b = R('CarveLegacyBudget', {"budgetId": "b" + RUN, "identity": 'x' * 250, "subject": S, "route": "chat.generate", "units": {"tokens": 1}, "ttl": "60s"}); print(s, b[:300])
s, j, h, b = R('CarveLegacyBudget', {"budgetId": "b" + RUN, "identity": 'x' * 249, "subject": 'tenant-a/nolegacy', "route": "chat.generate", "units": {"tokens": 1}, "ttl": "60s"}); print(s, b[:300])
SL = 'tenant-a/leg' + RUN
call('PublishPolicy', {"policy": {"subject": SL, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 100}]}})
s, j, h, b = R('CarveLegacyBudget', {"budgetId": "b" + RUN, "identity": 'gw-all', "subject": SL, "route": "chat.generate", "units": {"tokens": 50}, "ttl": "60s"}); print('carve', s, b[:600])
s, j, h, b = R('CarveLegacyBudget', {"budgetId": "b" + RUN, "identity": 'gw-all', "subject": SL, "route": "chat.generate", "units": {"tokens": 50}, "ttl": "60s"}); print('carve again', s, j.get('replayed') if j else b[:300])
s, j, h, b = call('ReconcileShard', {"shardId": "b" + RUN, "gatewayId": "legacy:gw-all", "receipts": []}, token=GW, svc='ShardService')
print('whole block', s, b[:400])
expect('legacy whole block', (s, j, h, b), 400, 'failed_precondition', 'LEGACY_WHOLE_BLOCK')
s, j, h, b = call('ReconcileShard', {"shardId": "b" + RUN, "gatewayId": "legacy:gw-all", "receipts": [{"reservationId": "l1", "state": "RESERVATION_STATE_SETTLED", "reservedUnits": {"tokens": 10}, "actualUnits": {"tokens": 10}}]}, token=GW, svc='ShardService')
print('legacy reconcile', s, b[:400])
check('legacy reconcile with own gateway token', s == 200, b[:300])
print('checked', N[0], 'fails', len(FAILS))
