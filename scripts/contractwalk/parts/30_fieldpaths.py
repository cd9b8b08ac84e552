# API.md, Errors, "Field paths": a validation refusal of a request with
# nested fields names the refused field first, by its path from the
# request's root as the JSON spells it (policy.holdTtl,
# policy.dimensions[1].burst, routes[1].route, receipts[1].reservationId),
# whichever check decided it; the path is a field of the request. The
# ErrorDetail carries the same path in its field (3), exactly.
RUN = str(int(time.time())) + 'f'
def fp(name, method, res, msg, rsn, svc='LedgerService'):
    s, j, h, b = res
    expect(name, res, 400, 'invalid_argument', rsn, msg, 'exact')
    m = (j or {}).get('message')
    check(name + ': path of the request', leading_path(method, m), m)
    check(name + ': ErrorDetail.field is the path', detail_field(j) == leading_path(method, m), (detail_field(j), m))
P = lambda pol: call('PublishPolicy', {"policy": pol})
T = {"unit": "tokens", "burst": 10}
sub = 'tenant-a/fp' + RUN
fp('policy missing', 'PublishPolicy', call('PublishPolicy', {}), 'policy is required', 'INVALID_POLICY')
fp('policy.schema', 'PublishPolicy', P({"schema": "other.v2", "subject": sub, "route": "r", "dimensions": [T]}),
   'policy.schema "other.v2": want admissionBudget.v1 (or leave it out)', 'INVALID_POLICY')
fp('policy.subject empty', 'PublishPolicy', P({"route": "r", "dimensions": [T]}), 'policy.subject is empty (use "*" for every subject)', 'INVALID_POLICY')
fp('policy.subject NUL', 'PublishPolicy', P({"subject": "a\u0000", "route": "r", "dimensions": [T]}), 'policy.subject contains a NUL byte', 'INVALID_POLICY')
fp('policy.dimensions none', 'PublishPolicy', P({"subject": sub, "route": "r"}), 'policy.dimensions: none given (a policy limits at least one unit)', 'INVALID_POLICY')
fp('policy.dimensions[1].unit twice', 'PublishPolicy', P({"subject": sub, "route": "r", "dimensions": [T, T]}),
   'policy.dimensions[1].unit "tokens" appears twice (also policy.dimensions[0])', 'INVALID_POLICY')
fp('policy.dimensions[1].burst', 'PublishPolicy', P({"subject": sub, "route": "r", "dimensions": [T, {"unit": "requests", "burst": 0}]}),
   'policy.dimensions[1].burst 0 is outside (0, 9007199254740992] (unit "requests")', 'INVALID_POLICY')
fp('policy.dimensions[0].refillInterval', 'PublishPolicy', P({"subject": sub, "route": "r", "dimensions": [{"unit": "tokens", "burst": 10, "refillUnits": 1}]}),
   'policy.dimensions[0].refillInterval 0s must be above 0 to mint refillUnits (unit "tokens")', 'INVALID_POLICY')
fp('policy.rollout', 'PublishPolicy', P({"subject": sub, "route": "r", "rollout": 7, "dimensions": [T]}),
   'policy.rollout 7 is neither ROLLOUT_MODE_ENFORCE nor ROLLOUT_MODE_SHADOW', 'INVALID_POLICY')
fp('policy.fairnessWeight', 'PublishPolicy', P({"subject": sub, "route": "r", "fairnessWeight": -1, "dimensions": [T]}),
   'policy.fairnessWeight -1 is outside [1, 1048576]', 'INVALID_POLICY')
# The same path whether the request spelt the field hold_ttl or holdTtl.
fp('policy.holdTtl as hold_ttl', 'PublishPolicy', P({"subject": sub, "route": "r", "hold_ttl": "0.05s", "dimensions": [T]}),
   'policy.holdTtl 0.050s is shorter than the minimum 0.100s (leave it out for the default 60s)', 'INVALID_POLICY')
R = lambda body: call('CreateRollout', body, svc='RolloutService')
ro = lambda routes: R({"name": "fp" + RUN, "hashBy": "route", "routes": routes})
fp('rollout hashBy', 'CreateRollout', R({"name": "fp" + RUN, "hashBy": "x", "routes": [{"route": "r"}]}), 'hashBy "x" is neither "route" nor "subject"', 'INVALID_ROLLOUT')
fp('rollout routes none', 'CreateRollout', ro([]), 'routes: none given (a rollout covers at least one route)', 'INVALID_ROLLOUT')
fp('rollout routes[1].route empty', 'CreateRollout', ro([{"route": "r"}, {"region": "eu"}]), 'routes[1].route is empty', 'INVALID_ROLLOUT')
fp('rollout routes[1].route *', 'CreateRollout', ro([{"route": "r"}, {"route": "*"}]),
   'routes[1].route "*" is not a wildcard (only a subject can be): publish one policy per route', 'INVALID_ROLLOUT')
fp('rollout routes[2] twice', 'CreateRollout', ro([{"route": "r"}, {"route": "q"}, {"route": "r", "region": "global"}]),
   'routes[2] r@global appears twice (also routes[0])', 'INVALID_ROLLOUT')
# Every other RolloutService method names the rollout by the same field.
RS = lambda method, body: call(method, body, svc='RolloutService')
fp('rollout name empty (GetRollout)', 'GetRollout', RS('GetRollout', {}), 'name is empty', 'INVALID_ROLLOUT')
fp('rollout name NUL (SetRolloutShare)', 'SetRolloutShare', RS('SetRolloutShare', {"name": "fp\u0000", "percent": 5}), 'name contains a NUL byte', 'INVALID_ROLLOUT')
fp('rollout name long (EndRollout)', 'EndRollout', RS('EndRollout', {"name": "n" * 129}), 'name is 129 bytes long; at most 128', 'INVALID_ROLLOUT')
# A count of items refused names its field first too.
fp('generations none', 'RollbackGenerations', RS('RollbackGenerations', {}), 'generations: 0 given; give 1 to 1000', 'INVALID_COMMAND')
fp('receiptIds too many', 'GetShard', call('GetShard', {"shardId": "fp" + RUN, "receiptIds": ["a"] * 10001}, svc='ShardService'),
   'receiptIds: 10001 given; at most 10000 per call', 'INVALID_COMMAND')
fp('reservationIds too many', 'GetResolverAnswers', call('GetResolverAnswers', {"reservationIds": ["a"] * 1001}, svc='ConsoleService'),
   'reservationIds: 1001 given; at most 1000', 'INVALID_COMMAND')
RC = lambda receipts: call('ReconcileShard', {"shardId": "fp" + RUN, "gatewayId": "gw-a", "receipts": receipts}, token=GWA, svc='ShardService')
rel = lambda rid, state='RELEASED': {"reservationId": rid, "state": "RESERVATION_STATE_" + state, "reservedUnits": {"tokens": 1}}
fp('receipts[0].reservationId required', 'ReconcileShard', RC([{"state": "RESERVATION_STATE_RELEASED"}]), 'receipts[0].reservationId is required', 'INVALID_COMMAND')
fp('receipts[1].reservationId twice', 'ReconcileShard', RC([rel("a"), rel("a")]), 'receipts[1].reservationId "a" appears twice (also receipts[0])', 'INVALID_COMMAND')
fp('receipts[0].state RESERVED', 'ReconcileShard', RC([rel("a", "RESERVED")]),
   'receipts[0].state is RESERVED (receipt a): release unstarted holds before reconciling', 'INVALID_COMMAND')
fp('receipts[0].reservedUnits negative', 'ReconcileShard', RC([{"reservationId": "a", "state": "RESERVATION_STATE_RELEASED", "reservedUnits": {"tokens": -1}}]),
   'receipts[0].reservedUnits: "tokens" is negative (-1)', 'INVALID_COMMAND')
# A new rollout's name is one word (API.md, CreateRollout); SetRolloutShare
# names its percent, IssueShard a legacy limiter's gatewayId.
fp('rollout name not a word (CreateRollout)', 'CreateRollout', R({"name": "bad name!", "hashBy": "route", "routes": [{"route": "r"}]}),
   "name holds ' ' at byte 3: use only ASCII letters, digits, '.', '_' and '-'", 'INVALID_ROLLOUT')
fp('rollout percent above 100', 'SetRolloutShare', RS('SetRolloutShare', {"name": "fp" + RUN, "percent": 100.5}),
   'percent 100.5: want 0 to 100 in steps of 0.01 (at most two decimals)', 'INVALID_ROLLOUT')
s, j, h, b = P({"subject": sub, "route": "r", "dimensions": [T]}); check('policy for the shard refusal', s == 200, b[:300])
fp('gatewayId of a legacy limiter (IssueShard)', 'IssueShard',
   call('IssueShard', {"shardId": "fp" + RUN, "subject": sub, "route": "r", "units": {"tokens": 1}, "gatewayId": "legacy:old", "bootEpoch": 1, "ttl": "60s"}, svc='ShardService'),
   'gatewayId "legacy:old" names a legacy limiter: its budget is carved by the operator (CarveLegacyBudget), not issued as a shard', 'INVALID_COMMAND')
