-- The pgbench floor for the PostgreSQL lease cycle with the account journal:
-- bench/sql/lease_cycle.sql, plus what the journal adds to each operation:
-- the account update also takes the account's next journal sequence number,
-- and a data-modifying CTE of the same statement inserts the entry numbered
-- by it, with the signed change of each counter. Run with
-- `pgbench -M prepared -c 8`; one script run is one cycle.
\set aid random(1, 1000)
WITH account AS (
    UPDATE tollgate_accounts
    SET available = available - 1, reserved = reserved + 1, next_fence = next_fence + 1,
        journal_seq = journal_seq + 1
    WHERE account_id = 'acct-' || :aid AND available >= 1
    RETURNING account_id, next_fence - 1 AS fencing_token, journal_seq
), secret AS (
    SELECT 'tgc_' || md5(random()::text) || md5(random()::text) AS capability
), expiry AS (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
), lease AS (
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, used,
                                 state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    SELECT 'lse_' || replace(gen_random_uuid()::text, '-', ''), a.account_id, a.fencing_token,
           sha256(convert_to(s.capability, 'UTF8')), 1, 0, 'active', e.now_us + 60000000, 0, FALSE
    FROM account AS a, secret AS s, expiry AS e
    RETURNING account_id, lease_id
), journal AS (
    INSERT INTO tollgate_journal (account_id, seq, kind, credited, available, reserved, consumed,
                                  overage, billed, next_fence, credit_id, lease_id, leases, events,
                                  at_floor_us, at_submicro_ns)
    SELECT a.account_id, a.journal_seq, 'acquire', 0, -1, 1, 0, 0, 0, 1, NULL, l.lease_id, '{}', NULL,
           e.now_us, 0
    FROM account AS a, lease AS l, expiry AS e
)
SELECT l.account_id, l.lease_id, s.capability FROM lease AS l, secret AS s
\gset
-- Release: as in lease_cycle.sql, and the entry with the settlement's change.
WITH lease AS (
    UPDATE tollgate_leases
    SET state = 'released', settled_at = now()
    WHERE account_id = :account_id
      AND lease_id = :lease_id
      AND state = 'active'
      AND capability_hash = sha256(convert_to(:capability, 'UTF8'))
      AND (expiry_floor_us, expiry_submicro_ns)
          > ((extract(epoch FROM clock_timestamp()) * 1000000)::bigint - 30000000, 0)
    RETURNING account_id, lease_id, granted, least(used, granted) AS consumed,
              greatest(used - granted, 0) AS overage
), account AS (
    UPDATE tollgate_accounts AS a
    SET available = a.available + l.granted - l.consumed,
        reserved  = a.reserved - l.granted,
        consumed  = a.consumed + l.consumed,
        overage   = a.overage + l.overage,
        journal_seq = a.journal_seq + 1
    FROM lease AS l
    WHERE a.account_id = l.account_id
    RETURNING a.account_id, a.journal_seq
)
INSERT INTO tollgate_journal (account_id, seq, kind, credited, available, reserved, consumed, overage,
                              billed, next_fence, credit_id, lease_id, leases, events, at_floor_us,
                              at_submicro_ns)
SELECT a.account_id, a.journal_seq, 'release', 0, l.granted - l.consumed, -l.granted, l.consumed,
       l.overage, 0, 0, NULL, l.lease_id, '{}', NULL,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 0
FROM account AS a, lease AS l;
