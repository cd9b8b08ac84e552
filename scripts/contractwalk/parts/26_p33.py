RUN = str(int(time.time())) + 'u'
SB = 'tenant-a/bb' + RUN
call('PublishPolicy', {"policy": {"subject": SB, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 100}]}})
it = lambda rid, n: {"reservationId": rid + RUN, "subject": SB, "route": "chat.generate", "units": {"tokens": n}}
s, j, h, b = call('ReserveBatch', {"requests": [it('x', 101), it('x', 5), it('x', 5), it('y', 0), it('y', 3)]})
o = j['outcomes']
check('refused item binds nothing', o[0].get('error', {}).get('rejection', {}).get('reason') == 'RESERVATION_TOO_LARGE' and 'ok' in o[1] and 'replayed' not in o[1]['ok'] and o[2].get('ok', {}).get('replayed') is True and o[3].get('error', {}).get('detail', {}).get('reason') == 'INVALID_COMMAND' and 'ok' in o[4], json.dumps(o)[:800])
call('Start', {"reservationId": "x" + RUN, "operationId": "o"})
st = lambda rid, n: {"reservationId": rid + RUN, "operationId": "o", "actualUnits": {"tokens": n}}
s, j, h, b = call('SettleBatch', {"requests": [st('x', 4), st('x', 4), st('x', 5), st('y', 1)]})
o = j['outcomes']
check('settle batch: second replay, third ALREADY_SETTLED, y not started', o[0].get('ok', {}).get('refundedUnits') == {"tokens": "1"} and o[1].get('ok', {}).get('replayed') is True and 'refundedUnits' not in o[1]['ok'] and o[2].get('error', {}).get('detail', {}).get('reason') == 'RESERVATION_ALREADY_SETTLED' and o[3].get('error', {}).get('detail', {}).get('reason') == 'RESERVATION_NOT_STARTED', json.dumps(o)[:1200])
check('state error in batch carries reservation', 'reservation' in o[2].get('error', {}).get('detail', {}), json.dumps(o[2])[:300])
# ListDebts paging with many debtors
for i in range(5):
    subj = 'tenant-a/d%d-%s' % (i, RUN)
    call('PublishPolicy', {"policy": {"subject": subj, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 10, "refillUnits": 1, "refillInterval": "3600s"}]}})
    call('RecordUsage', {"reservationId": "rd%d" % i + RUN, "operationId": "o", "subject": subj, "route": "chat.generate", "actualUnits": {"tokens": 50}})
seen = []; tok = None; calls = 0
while True:
    body = {"pageSize": 1}
    if tok: body['pageToken'] = tok
    s, j, h, b = call('ListDebts', body, token=VIEW); calls += 1
    check('ListDebts page ok', s == 200, b[:300])
    seen += [a['subject'] for a in j.get('accounts', [])]
    tok = j.get('nextPageToken')
    if not tok or calls > 50: break
mine = [x for x in seen if x.endswith(RUN)]
check('ListDebts paging finds all 5 in key order', mine == sorted(mine) and len(mine) == 5 and len(seen) == len(set(seen)), (seen, calls))
print('calls', calls)
a = [x for x in seen]
s, j, h, b = call('ListDebts', {"pageSize": 100}, token=VIEW)
acc = [x for x in j.get('accounts', []) if x['subject'].endswith(RUN)]
check('debts accounts frozen, debt per balance', all(x.get('frozen') is True and any(bb.get('debt') for bb in x['balances']) for x in acc), json.dumps(acc)[:400])
print('checked', N[0], 'fails', len(FAILS))
