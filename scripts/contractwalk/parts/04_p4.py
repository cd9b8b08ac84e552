import re
st = STATE; S, G, RUN, S2, G2 = st['S'], st['G'], st['RUN'] + 'c', st['S2'], st['G2']
S4 = 'tenant-a/batch' + RUN
s, j, h, b = call('PublishPolicy', {"policy": {"subject": S4, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 100, "refillUnits": 1, "refillInterval": "0.300s"}]}})
G4 = j['policy']['generation']; print('pol4', j['policy']['dimensions'])
items = [
  {"reservationId": "b1-" + RUN, "subject": S4, "route": "chat.generate", "units": {"tokens": 90}},
  {"reservationId": "b1-" + RUN, "subject": S4, "route": "chat.generate", "units": {"tokens": 90}},
  {"reservationId": "b1-" + RUN, "subject": S4, "route": "chat.generate", "units": {"tokens": 91}},
  {"reservationId": "b2-" + RUN, "subject": S4, "route": "chat.generate", "units": {"tokens": 7}},
  {"reservationId": "", "subject": S4, "route": "chat.generate", "units": {"tokens": 1}},
  {"reservationId": "b3-" + RUN, "subject": S4, "route": "chat.generate", "units": {"gpus": 1}},
  {"reservationId": "b4-" + RUN, "subject": "tenant-a/none" + RUN, "route": "chat.generate", "units": {"tokens": 1}},
  {"reservationId": "b5-" + RUN, "subject": S4, "route": "chat.generate", "units": {"tokens": 101}},
  {"reservationId": "b6-" + RUN, "subject": S4, "route": "chat.generate", "units": {"tokens": 10}},
]
s, j, h, b = call('ReserveBatch', {"requests": items}, token=GWA)
print('batch', s, h.get('retry-after'), b.decode()[:3000])
check('batch 200, no Retry-After', s == 200 and 'retry-after' not in h, (s, h))
o = j['outcomes']
check('batch count', len(o) == len(items), len(o))
check('item0 ok', 'ok' in o[0] and o[0]['ok']['reservation']['state'] == 'RESERVATION_STATE_RESERVED', o[0])
check('item1 replayed', 'ok' in o[1] and o[1]['ok'].get('replayed') is True, o[1])
check('item2 digest mismatch', o[2].get('error', {}).get('code') == 'already_exists' and o[2]['error'].get('detail', {}).get('reason') == 'DIGEST_MISMATCH', o[2])
check('item3 admitted (7 of the 10 left)', 'ok' in o[3], o[3])
check('item8 insufficient, no retryAfter (beyond burst - reserved)', o[8].get('error', {}).get('rejection', {}).get('reason') == 'INSUFFICIENT_CAPACITY' and 'retryAfter' not in o[8]['error']['rejection'], o[8])
check('item4 invalid, message without path', o[4].get('error', {}).get('code') == 'invalid_argument' and o[4]['error'].get('message') == 'reservationId is required', o[4])
check('item5 unknown unit', o[5].get('error', {}).get('detail', {}).get('reason') == 'UNKNOWN_UNIT', o[5])
# API.md, "Field paths": an item's ErrorDetail.field is within the item, as
# its message is; a refusal that is no validation refusal has none.
check('item4 detail field within the item', o[4].get('error', {}).get('detail', {}).get('field') == 'reservationId', o[4])
check('item5 detail field the units map', o[5].get('error', {}).get('detail', {}).get('field') == 'units', o[5])
check('item6 no policy: no field', 'field' not in o[6].get('error', {}).get('detail', {}), o[6])
check('item6 no policy', o[6].get('error', {}).get('code') == 'not_found' and o[6]['error'].get('detail', {}).get('reason') == 'NO_POLICY' and o[6]['error'].get('message') == 'no active policy: tenant-a/none%s/chat.generate@global' % RUN, o[6])
check('item7 too large', o[7].get('error', {}).get('rejection', {}).get('reason') == 'RESERVATION_TOO_LARGE', o[7])
# item3 Retry-After check: need 7, available 10 -> wait, 100-90=10 so 7 fits?
s, j, h, b = call('SettleBatch', {"requests": [{"reservationId": "b1-" + RUN, "operationId": "o", "actualUnits": {"tokens": 1}}, {"reservationId": "nobody" + RUN, "operationId": "o", "actualUnits": {"tokens": 1}}]}, token=GWA)
print('settlebatch', s, b.decode()[:1500])
check('settlebatch not started / not found', s == 200 and j['outcomes'][0].get('error', {}).get('detail', {}).get('reason') == 'RESERVATION_NOT_STARTED' and j['outcomes'][1].get('error', {}).get('detail', {}).get('reason') == 'RESERVATION_NOT_FOUND', b)
expect('empty batch', call('ReserveBatch', {"requests": []}), 400, 'invalid_argument', 'INVALID_COMMAND', 'requests: a batch needs at least one item', 'prefix')
expect('null batch', call('ReserveBatch', {"requests": None}), 400, 'invalid_argument', 'INVALID_COMMAND', 'requests: a batch needs at least one item', 'prefix')
expect('missing batch', call('ReserveBatch', {}), 400, 'invalid_argument', 'INVALID_COMMAND', 'requests: a batch needs at least one item', 'prefix')
expect('empty settle batch', call('SettleBatch', {}), 400, 'invalid_argument', 'INVALID_COMMAND')
big = [{"reservationId": "bb%d" % i, "subject": S4, "route": "chat.generate", "units": {"tokens": 1}} for i in range(1001)]
s, j, h, b = call('ReserveBatch', {"requests": big})
expect('1001 items', (s, j, h, b), 400, 'invalid_argument', 'INVALID_COMMAND'); print('1001', b[:300])
# Retry-After value
S5 = 'tenant-a/ra' + RUN
call('PublishPolicy', {"policy": {"subject": S5, "route": "chat.generate", "dimensions": [{"unit": "tokens", "burst": 100, "refillUnits": 1, "refillInterval": "0.300s"}]}})
call('Reserve', {"reservationId": "ra1-" + RUN, "subject": S5, "route": "chat.generate", "units": {"tokens": 50}})
call('Start', {"reservationId": "ra1-" + RUN, "operationId": "o"})
settled_at = time.time()
call('Settle', {"reservationId": "ra1-" + RUN, "operationId": "o", "actualUnits": {"tokens": 50}})
s, j, h, b = call('Reserve', {"reservationId": "ra2-" + RUN, "subject": S5, "route": "chat.generate", "units": {"tokens": 55}})
lag = time.time() - settled_at
print('ra', s, h.get('retry-after'), 'lag %.2fs' % lag, b)
# need 5 more -> 5 intervals of 0.3 = 1.5s -> Retry-After 2 (whole seconds,
# rounded up); on a loaded machine refill between the Settle and the Reserve
# (lag) shortens the wait: at least ceil(1.5 - lag), never above 2.
import math
check('Retry-After 2 for 1.5s', h.get('retry-after') in [str(n) for n in range(max(1, math.ceil(1.5 - lag - 0.3)), 3)], (h.get('retry-after'), lag))
# Wait the Retry-After and retry: promise says admitted
time.sleep(int(h.get('retry-after', '0')))
s, j, h, b = call('Reserve', {"reservationId": "ra2-" + RUN, "subject": S5, "route": "chat.generate", "units": {"tokens": 55}})
check('retry after Retry-After admitted', s == 200, b)
# ListPolicies pagination
s, j, h, b = call('ListPolicies', {"pageSize": 2})
print('lp', s, [p['generation'] for p in j.get('policies', [])], j.get('nextPageToken'))
check('ListPolicies oldest first, 2, token', s == 200 and [p['generation'] for p in j['policies']] == ['1', '2'] and j.get('nextPageToken'), b[:300])
tok = j.get('nextPageToken'); seen = [p['generation'] for p in j['policies']]
while tok:
    s, j, h, b = call('ListPolicies', {"pageSize": 2, "pageToken": tok}); seen += [p['generation'] for p in j.get('policies', [])]; tok = j.get('nextPageToken')
check('ListPolicies all', seen == [str(i) for i in range(1, len(seen) + 1)], seen)
s0, j0, _, _ = call('ListPolicies', {"pageSize": 1})
expect('ListPolicies token other filter', call('ListPolicies', {"pageSize": 1, "pageToken": j0['nextPageToken'], "route": "chat.generate"}), 400, 'invalid_argument', 'INVALID_COMMAND', 'pageToken: issued for another subject, route or region filter', 'prefix')
expect('ListPolicies token by other token', call('ListPolicies', {"pageSize": 1, "pageToken": j0['nextPageToken']}, token=VIEW), 400, 'invalid_argument', 'INVALID_COMMAND', 'pageToken: not a nextPageToken this server issued', 'prefix')
expect('ListPolicies token handmade', call('ListPolicies', {"pageSize": 1, "pageToken": "abc"}), 400, 'invalid_argument', 'INVALID_COMMAND', 'pageToken: not a nextPageToken this server issued', 'prefix')
expect('ListPolicies token of ListDebts', call('ListDebts', {"pageSize": 1, "pageToken": j0['nextPageToken']}), 400, 'invalid_argument', 'INVALID_COMMAND', 'pageToken: not a nextPageToken this server issued', 'prefix')
expect('ListPolicies pageSize 1001', call('ListPolicies', {"pageSize": 1001}), 400, 'invalid_argument', 'INVALID_COMMAND')
s, j, h, b = call('ListPolicies', {}); check('ListPolicies default', s == 200 and 'nextPageToken' not in j, b[:200])
s, j, h, b = call('ListPolicies', {"pageSize": 0}); check('ListPolicies pageSize 0 = default', s == 200, b[:200])
expect('ListPolicies pageSize -1', call('ListPolicies', {"pageSize": -1}), 400, 'invalid_argument')
print('ps-1', call('ListPolicies', {"pageSize": -1})[3][:300])
s, j, h, b = call('ListPolicies', {"subject": "*"}); check('ListPolicies subject * ok', s == 200, b[:200])
s, j, h, b = call('ListPolicies', {}, token=GWB); check('ListPolicies scoped gw-b sees none', s == 200 and not j.get('policies'), b[:300])
print('checked', N[0], 'fails', len(FAILS))
