M = {
 'LedgerService': 'PublishPolicy GetPolicy ListPolicies RollbackPolicy Reserve ReserveBatch Start Settle SettleBatch RecordUsage Release MarkUsageUnknown GetReservation GetAccount ListUsageUnknown ListDebts Audit'.split(),
 'ConsoleService': 'GetOverview ListAccountStandings GetFairness ListSubjectReservations ListStatements GetResolverAnswers'.split(),
 'RolloutService': 'CreateRollout GetRollout ListRollouts SetRolloutShare UndoRolloutStep EndRollout ShadowReport RollbackGenerations DrainProgress CarveLegacyBudget'.split(),
 'ShardService': 'IssueShard GetShard ListShards ReconcileShard ListShardKeys'.split(),
}
GETOK = set('GetPolicy ListPolicies GetReservation GetAccount Audit ListUsageUnknown ListDebts GetShard ListShards ListShardKeys GetRollout ListRollouts ShadowReport'.split()) | set(M['ConsoleService'])
gw = set('Reserve ReserveBatch Start Settle SettleBatch RecordUsage Release MarkUsageUnknown GetReservation GetAccount GetPolicy ListPolicies'.split()) | set(M['ShardService'])
viewer = set('GetReservation GetAccount GetPolicy ListPolicies ListUsageUnknown ListDebts GetShard ListShards ListShardKeys GetRollout ListRollouts ShadowReport DrainProgress'.split()) | set(M['ConsoleService'])
for svc, ms in M.items():
    for m in ms:
        path = '/capledger.v1.%s/%s?encoding=json&message=%%7B%%7D' % (svc, m)
        s, j, h, b = call(m, None, http_method='GET', path=path, token=VIEW)
        if m in GETOK:
            check('GET allowed %s' % m, s != 405, (s, b[:200]))
        else:
            check('GET refused %s' % m, s == 405 and h.get('allow') == 'POST', (s, h.get('allow'), b[:200]))
            if s != 405: print('  GET', m, s, b[:200])
        if m in GETOK:
            check('Cache-Control no-store %s' % m, h.get('cache-control') == 'no-store', (s, h.get('cache-control'), b[:100]))
        # PUT
        s, j, h, b = call(m, None, http_method='PUT', path='/capledger.v1.%s/%s' % (svc, m))
        check('PUT 405 %s' % m, s == 405 and (h.get('allow') == ('POST, GET' if m in GETOK else 'POST') or (m in GETOK and set(x.strip() for x in h.get('allow','').split(','))=={'POST','GET'})), (s, h.get('allow')))
        for tok, allowed, rn in ((GW, gw, 'gateway'), (VIEW, viewer, 'viewer')):
            s, j, h, b = call(m, {}, token=tok, svc=svc)
            if m in allowed:
                check('%s may call %s' % (rn, m), s != 403, (s, b[:200]))
            else:
                check('%s may not call %s' % (rn, m), s == 403 and reason(j) == 'PERMISSION_DENIED', (s, b[:200]))
        s, j, h, b = call(m, {}, token=None, svc=svc)
        check('no token 401 %s' % m, s == 401, (s, b[:200]))
print('checked', N[0], 'fails', len(FAILS))
