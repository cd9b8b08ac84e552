-- capledger schema version 20: the policies by key.
--
-- PolicyPage with a subject (ListPolicies' subject filter, the console's
-- policy list of one tenant) read the policies table in generation order
-- and tested every row: with a policy per tenant, 100,000 rows for the
-- few of one subject. This index holds the policies by key and
-- generation, as PostgreSQL's policies_key (its migration 1): a subject's
-- policies are one range of it, a key's one range in generation order.
-- The migration reads every policy once; a publish writes one entry more.
CREATE INDEX IF NOT EXISTS policies_key ON policies (subject, route, region, generation);
