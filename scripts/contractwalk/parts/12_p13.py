RUN = str(int(time.time())) + 'j'
SB = 'tenant-b/u' + RUN; SA = 'tenant-a/u' + RUN
for subj in (SA, SB):
    call('PublishPolicy', {"policy": {"subject": subj, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 100}]}})
    for i in range(3):
        rid = '%s-%d' % (subj, i)
        call('Reserve', {"reservationId": rid, "subject": subj, "route": "chat.generate", "units": {"tokens": 1}})
        call('Start', {"reservationId": rid, "operationId": "o"})
        call('MarkUsageUnknown', {"reservationId": rid})
s, j, h, b = call('ListUsageUnknown', {"pageSize": 2}, token=DASHB)
print('scoped luu', b[:400])
check('scoped ListUsageUnknown: no backlog/oldest', s == 200 and 'backlog' not in j and 'oldestUsageUnknownAt' not in j, b[:300])
seen = [r['reservationId'] for r in j.get('reservations', [])]; tok = j.get('nextPageToken'); calls = 1
while tok:
    s, j, h, b = call('ListUsageUnknown', {"pageSize": 2, "pageToken": tok}, token=DASHB); calls += 1
    check('page ok', s == 200, b[:300])
    seen += [r['reservationId'] for r in j.get('reservations', [])]; tok = j.get('nextPageToken')
check('scoped sees only tenant-b', all(x.startswith('tenant-b/') for x in seen) and len([x for x in seen if x.startswith(SB)]) == 3, seen)
s, j, h, b = call('ListUsageUnknown', {"pageSize": 2}, token=VIEW)
tok = j.get('nextPageToken')
expect('token of other token refused', call('ListUsageUnknown', {"pageSize": 2, "pageToken": tok}, token=DASHB), 400, 'invalid_argument', 'INVALID_COMMAND', 'pageToken: not a nextPageToken this server issued', 'prefix')
expect('token of other method refused', call('ListDebts', {"pageSize": 2, "pageToken": tok}, token=VIEW), 400, 'invalid_argument', 'INVALID_COMMAND', 'pageToken: not a nextPageToken this server issued', 'prefix')
s, j, h, b = call('ListUsageUnknown', {"subject": SA}, token=DASHB)
check('scoped filter unmatched -> nothing, no token', s == 200 and not j.get('reservations') and 'nextPageToken' not in j, b[:300])
s, j, h, b = call('GetReservation', {"reservationId": SA + '-0'}, token=DASHB)
expect('viewer oos getreservation', (s, j, h, b), 404, 'not_found', 'RESERVATION_NOT_FOUND', 'reservation not found: %s-0' % SA)
s, j, h, b = call('Settle', {"reservationId": SA + '-0', "operationId": "o", "actualUnits": {"tokens": 1}}, token=GWB)
expect('gw oos settle', (s, j, h, b), 404, 'not_found', 'RESERVATION_NOT_FOUND')
s, j, h, b = call('SettleBatch', {"requests": [{"reservationId": SA + '-0', "operationId": "o", "actualUnits": {"tokens": 1}}]}, token=GWB)
check('gw oos settlebatch item not found', s == 200 and j['outcomes'][0].get('error', {}).get('detail', {}).get('reason') == 'RESERVATION_NOT_FOUND', b[:300])
# gw-a: routes=chat.* only
call('PublishPolicy', {"policy": {"subject": SA, "route": "embed.x", "dimensions": [{"unit": "tokens", "burst": 100}]}})
s, j, h, b = call('Reserve', {"reservationId": 'er' + RUN, "subject": SA, "route": "embed.x", "units": {"tokens": 1}}, token=GWA)
expect('route oos reserve NO_POLICY', (s, j, h, b), 404, 'not_found', 'NO_POLICY', 'no active policy: %s/embed.x@global' % SA)
s, j, h, b = call('ListPolicies', {"subject": SA}, token=GWA)
check('ListPolicies route scope', s == 200 and all(p['route'].startswith('chat.') for p in j.get('policies', [])) and len(j.get('policies', [])) == 1, b[:400])
s, j, h, b = call('ListPolicies', {"route": "embed.x"}, token=GWA)
check('ListPolicies unmatched route filter: none, no token', s == 200 and not j.get('policies') and 'nextPageToken' not in j, b[:300])
# ListDebts scoped / shards scoped
s, j, h, b = call('ListShards', {}, token=DASHB, svc='ShardService')
check('ListShards scoped none of tenant-a', s == 200 and all(x['subject'].startswith('tenant-b/') for x in j.get('shards', [])), b[:300])
# 'permission_denied' message
s, j, h, b = call('Audit', {}, token=GW); print('403 body', b)
print('checked', N[0], 'fails', len(FAILS))
