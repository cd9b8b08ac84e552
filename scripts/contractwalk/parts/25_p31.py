RUN = str(int(time.time())) + 's'
SG = 'tenant-a/gen' + RUN
def pub(burst, extra=None):
    d = [{"unit": "tokens", "burst": burst, "refillUnits": 1, "refillInterval": "10s"}]
    if extra: d += extra
    s, j, h, b = call('PublishPolicy', {"policy": {"subject": SG, "route": "chat.generate", "dimensions": d}}); return j['policy']['generation']
def rsv(rid, n):
    return call('Reserve', {"reservationId": rid + RUN, "subject": SG, "route": "chat.generate", "units": {"tokens": n}})
gA = pub(100)
rsv('a1', 30); call('Start', {"reservationId": 'a1' + RUN, "operationId": "o"}); call('Settle', {"reservationId": 'a1' + RUN, "operationId": "o", "actualUnits": {"tokens": 30}})
rsv('a2', 50)  # held under A
gB = pub(100, [{"unit": "requests", "burst": 5}])
s, j, h, b = rsv('b1', 21)
print('b1 (21 > 100-50-30=20)', s, h.get('retry-after'), b[:300])
s, j, h, b = rsv('b2', 20)
print('b2 (20)', s, b[:200])
check('b2 under B, carried capacity', s == 200 and j['policyGeneration'] == gB, b[:300])
s, j, h, b = call('GetAccount', {"subject": SG, "route": "chat.generate"})
print('accounts', b[:1500])
gens = [a['policyGeneration'] for a in j['accounts']]
check('GetAccount oldest first', gens == sorted(gens, key=int) and gens == [gA, gB], gens)
for a in j['accounts']:
    for bal in a['balances']:
        f = lambda k: int(bal.get(k, '0'))
        check('conservation %s %s' % (a['policyGeneration'], bal['unit']), f('opening') + f('minted') + f('overdraftIssued') == f('available') + f('reserved') + f('spent') + f('retiredForEmergency') + f('retiredForMove') + f('overdraftRepaid'), bal)
# release A's hold: refund forwarded to B?
s, j, h, b = call('Release', {"reservationId": 'a2' + RUN}); print('release a2', s, j.get('refundedUnits') if j else b)
s, j, h, b = rsv('b3', 50); print('b3 (50 after A hold released)', s, b[:200])
check('A release refund reaches B', s == 200, b[:300])
s, j, h, b = call('Audit', {}); check('audit clean', s == 200 and not j.get('discrepancies'), b[:500])
print('checked', N[0], 'fails', len(FAILS))
