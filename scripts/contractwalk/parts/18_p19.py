RUN = str(int(time.time())) + 'p'
SE = 'tenant-b/ep' + RUN
s, j, h, b = call('PublishPolicy', {"policy": {"subject": SE, "route": "chat.generate", "epochLength": "1s", "dimensions": [{"unit": "tokens", "burst": 100, "refillUnits": 5, "refillInterval": "0.5s"}]}}); g = j['policy']['generation']
STATE['EPOCHS'] = (SE, g)  # 31_statement_tokens pages these statements
for i in range(4):
    call('Reserve', {"reservationId": "e%d" % i + RUN, "subject": SE, "route": "chat.generate", "units": {"tokens": 10}})
    time.sleep(1.1)
time.sleep(2.5)
C = lambda m, body, tok=ADMIN: call(m, body, token=tok, svc='ConsoleService')
s, j, h, b = C('ListStatements', {"subject": SE, "route": "chat.generate", "policyGeneration": g, "pageSize": 2})
print('stmts', s, b[:1500])
st = j.get('statements', [])
check('statements latest first', len(st) == 2 and st[0]['epochStart'] > st[1]['epochStart'], b[:300])
check('statement fields', st and all(k in st[0] for k in ('epochStart', 'epochEnd', 'opening', 'closing')), st[:1])
tok = j.get('nextPageToken')
check('statements next token', tok, j)
if tok:
    s2, j2, _, b2 = C('ListStatements', {"subject": SE, "route": "chat.generate", "policyGeneration": g, "pageSize": 2, "pageToken": tok})
    check('page 2', s2 == 200 and j2.get('statements'), b2[:300])
    if j2.get('statements'):
        check('chain: page1 last opening == page2 first closing', st[-1]['opening'] == j2['statements'][0]['closing'], (st[-1]['opening'], j2['statements'][0]['closing']))
    expect('token other account', C('ListStatements', {"subject": SE, "route": "chat.generate", "region": "eu", "policyGeneration": g, "pageSize": 2, "pageToken": tok}), 400, 'invalid_argument', 'INVALID_COMMAND', 'pageToken: issued for another account', 'prefix')
s, j, h, b = C('ListStatements', {"subject": SE, "route": "chat.generate", "policyGeneration": g}, DASHB)
check('scoped in-scope statements visible', s == 200 and j.get('statements'), b[:200])
s, j, h, b = call('Audit', {})
check('audit clean', s == 200 and not j.get('discrepancies'), b[:1000])
s, j, h, b = C('GetOverview', {})
print('overview audit', json.dumps(j.get('audit')))
a = j.get('audit', {})
check('overview audit fields', a.get('lastBy') == 'ops' and a.get('lastMode') == 'full' and a.get('lastCleanBy') == 'ops' and a.get('persisted') is True and 'lastAuditAt' in a, a)
s, j, h, b = call('x', None, http_method='GET', path='/metrics', token=None)
for line in b.decode().splitlines():
    if line.startswith('capledger_audit_last_run') or line.startswith('capledger_debt_accounts') : print('  ', line)
print('checked', N[0], 'fails', len(FAILS))
