# API.md, ConsoleService, ListStatements: with a tokens file every
# nextPageToken is sealed, as the other lists' are, bound to the method and
# the token it was issued to: one built by hand, altered, another method's
# or another token's is 400 INVALID_COMMAND, `pageToken: not a
# nextPageToken this server issued ...`.
SE_, gen = STATE['EPOCHS']
C = lambda m, body, tok=ADMIN: call(m, body, token=tok, svc='ConsoleService')
body = {"subject": SE_, "route": "chat.generate", "policyGeneration": gen, "pageSize": 1}
s, j, h, b = C('ListStatements', body)
tok = (j or {}).get('nextPageToken') or ''
check('statements token sealed', s == 200 and tok.startswith('p1.'), b[:300])
NOT_ISSUED = 'pageToken: not a nextPageToken this server issued for this method and token'
def refused(name, token, caller=ADMIN):
    expect('statements token ' + name, C('ListStatements', dict(body, pageToken=token), caller), 400, 'invalid_argument', 'INVALID_COMMAND', NOT_ISSUED, 'prefix')
# A cursor as this method wrote it when it was plain: "e", an epoch start
# in Unix nanoseconds, "/", a 16-hex-digit account digest; base64url.
refused('built by hand', base64.urlsafe_b64encode(b'e1000000000/0123456789abcdef').decode().rstrip('='))
if tok:
    mid = len(tok) // 2
    refused('altered', tok[:mid] + ('B' if tok[mid] == 'A' else 'A') + tok[mid + 1:])
    refused('truncated', tok[:-3])
    refused('of another token', tok, DASHB)
    s, j, h, b = call('ListPolicies', {"pageSize": 1})
    refused('of another method', (j or {}).get('nextPageToken') or 'none')
    s, j, h, b = C('ListStatements', dict(body, pageToken=tok))
    check('statements token pages on', s == 200 and len((j or {}).get('statements', [])) == 1, b[:300])
