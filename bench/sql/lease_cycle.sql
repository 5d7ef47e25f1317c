-- The pgbench baseline for the PostgreSQL lease cycle: the minimal hand-written
-- SQL that makes the same row changes as PostgresStore::acquire followed by
-- PostgresStore::release, one transaction (one autocommitted statement) per
-- operation. Run with `pgbench -M prepared -c 8`; one script run is one cycle.
--
-- Acquire: debit the account, take its next fence, and insert the lease with
-- the SHA-256 of a fresh random capability and an exact expiry one minute out.
\set aid random(1, 1000)
WITH account AS (
    UPDATE tollgate_accounts
    SET available = available - 1, reserved = reserved + 1, next_fence = next_fence + 1
    WHERE account_id = 'acct-' || :aid AND available >= 1
    RETURNING account_id, next_fence - 1 AS fencing_token
), secret AS (
    SELECT 'tgc_' || md5(random()::text) || md5(random()::text) AS capability
), expiry AS (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 60000000 AS floor_us
)
INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, used,
                             state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
SELECT 'lse_' || replace(gen_random_uuid()::text, '-', ''), a.account_id, a.fencing_token,
       sha256(convert_to(s.capability, 'UTF8')), 1, 0, 'active', e.floor_us, 0, FALSE
FROM account AS a, secret AS s, expiry AS e
RETURNING account_id, lease_id, (SELECT capability FROM secret) AS capability
\gset
-- Release: check the capability and that the lease is active and before its
-- reclaim boundary (30 s grace), mark it released, and settle the account.
WITH lease AS (
    UPDATE tollgate_leases
    SET state = 'released', settled_at = now()
    WHERE account_id = :account_id
      AND lease_id = :lease_id
      AND state = 'active'
      AND capability_hash = sha256(convert_to(:capability, 'UTF8'))
      AND (expiry_floor_us, expiry_submicro_ns)
          > ((extract(epoch FROM clock_timestamp()) * 1000000)::bigint - 30000000, 0)
    RETURNING account_id, granted, used
)
UPDATE tollgate_accounts AS a
SET available = a.available + l.granted - least(l.used, l.granted),
    reserved  = a.reserved - l.granted,
    consumed  = a.consumed + least(l.used, l.granted),
    overage   = a.overage + greatest(l.used - l.granted, 0)
FROM lease AS l
WHERE a.account_id = l.account_id;
