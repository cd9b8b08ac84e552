st = STATE; S, G = st['S'], st['G']
RUN = str(int(time.time())) + 'l'
L = lambda n: 'x' * n
NUL = 'a\u0000b'
cases = [
 ('LedgerService', 'ListUsageUnknown', {"subject": L(513)}, 'subject is 513 bytes long; at most 512'),
 ('LedgerService', 'ListUsageUnknown', {"route": NUL}, 'route contains a NUL byte'),
 ('LedgerService', 'ListPolicies', {"subject": L(513)}, 'subject is 513 bytes long; at most 512'),
 ('LedgerService', 'ListPolicies', {"region": NUL}, 'region contains a NUL byte'),
 ('LedgerService', 'GetAccount', {"subject": S, "route": "chat.generate", "region": L(513)}, 'region is 513 bytes long; at most 512'),
 ('LedgerService', 'GetReservation', {"reservationId": L(257)}, 'reservationId is 257 bytes long; at most 256'),
 ('LedgerService', 'Release', {"reservationId": NUL}, 'reservationId contains a NUL byte'),
 ('LedgerService', 'MarkUsageUnknown', {"reservationId": L(257)}, 'reservationId is 257 bytes long; at most 256'),
 ('LedgerService', 'Start', {"reservationId": "a", "operationId": L(257)}, 'operationId is 257 bytes long; at most 256'),
 ('LedgerService', 'Settle', {"reservationId": "a", "operationId": "o", "actualUnits": {NUL: 1}}, None),
 ('LedgerService', 'RecordUsage', {"reservationId": "a", "operationId": "o", "subject": S, "route": "chat.generate", "actualUnits": {L(300): 1}}, 'actualUnits: a unit name is 300 bytes long; at most 128'),
 ('LedgerService', 'RecordUsage', {"reservationId": "a", "operationId": "o", "subject": "*", "route": "chat.generate", "actualUnits": {"tokens": 1}}, None),
 ('LedgerService', 'RecordUsage', {"reservationId": "a", "operationId": "o", "subject": S, "route": "chat.generate", "actualUnits": {"tokens": "9007199254740993"}}, None),
 ('LedgerService', 'Reserve', {"reservationId": "a", "subject": S, "route": "chat.generate", "region": L(513), "units": {"tokens": 1}}, 'region is 513 bytes long; at most 512'),
 ('ConsoleService', 'ListSubjectReservations', {"subject": L(513)}, 'subject is 513 bytes long; at most 512'),
 ('ConsoleService', 'ListAccountStandings', {"subjectContains": L(513)}, 'subjectContains is 513 bytes long; at most 512'),
 ('ConsoleService', 'ListAccountStandings', {"route": NUL}, 'route contains a NUL byte'),
 ('ConsoleService', 'GetFairness', {"route": L(513)}, 'route is 513 bytes long; at most 512'),
 ('ConsoleService', 'ListStatements', {"subject": S, "route": "chat.generate", "policyGeneration": G, "region": NUL}, 'region contains a NUL byte'),
 ('ConsoleService', 'GetResolverAnswers', {"reservationIds": ["a", L(257)]}, 'reservationIds[1] is 257 bytes long; at most 256'),
 ('ShardService', 'ListShards', {"gatewayId": L(257)}, 'gatewayId is 257 bytes long; at most 256'),
 ('ShardService', 'GetShard', {"shardId": NUL}, 'shardId contains a NUL byte'),
 ('ShardService', 'GetShard', {"shardId": "s", "receiptIds": [L(257)]}, 'receiptIds[0] is 257 bytes long; at most 256'),
 ('ShardService', 'ReconcileShard', {"shardId": "s", "gatewayId": "gw-a", "receipts": [{"reservationId": NUL, "state": "RESERVATION_STATE_RELEASED"}]}, 'receipts[0].reservationId contains a NUL byte'),
 ('ShardService', 'IssueShard', {"shardId": "s", "subject": S, "route": "chat.generate", "units": {"tokens": 1}, "gatewayId": "gw-a", "bootEpoch": 1, "ttl": "9223372036.5s"}, 'ttl 9223372036.500s is longer than the maximum 9223372036s (about 292 years)'),
 ('ShardService', 'IssueShard', {"shardId": L(257), "subject": S, "route": "chat.generate", "units": {"tokens": 1}, "gatewayId": "gw-a", "bootEpoch": 1, "ttl": "1s"}, 'shardId is 257 bytes long; at most 256'),
 ('RolloutService', 'CreateRollout', {"name": L(129), "hashBy": "route", "routes": [{"route": "q", "region": "global"}]}, None),
 ('RolloutService', 'GetRollout', {"name": NUL}, None),
 ('RolloutService', 'CarveLegacyBudget', {"budgetId": "b", "identity": L(250), "subject": S, "route": "chat.generate", "units": {"tokens": 1}, "ttl": "60s"}, 'identity is 250 bytes long; at most 249'),
]
for svc, m, body, msg in cases:
    s, j, h, b = call(m, body, svc=svc)
    want_reason = 'INVALID_ROLLOUT' if svc == 'RolloutService' and m != 'CarveLegacyBudget' else 'INVALID_COMMAND'
    ok = s == 400 and j and j.get('code') == 'invalid_argument' and reason(j) == want_reason and (msg is None or j.get('message') == msg)
    check('%s %s' % (m, str(body)[:60]), ok, (s, b[:300]))
    if ok and msg is None: print('  ', m, j.get('message'))
# Connect GET variant
q = urllib.parse.quote(json.dumps({"subject": L(513)}))
s, j, h, b = call('x', None, http_method='GET', path='/capledger.v1.LedgerService/ListUsageUnknown?encoding=json&message=' + q)
expect('GET filter too long', (s, j, h, b), 400, 'invalid_argument', 'INVALID_COMMAND', 'subject is 513 bytes long; at most 512')
print('checked', N[0], 'fails', len(FAILS))
