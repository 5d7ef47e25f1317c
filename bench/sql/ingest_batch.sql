-- The pgbench baseline for PostgreSQL ingestion: one INSERT … ON CONFLICT DO
-- NOTHING of 1000 events plus the counter updates and the accounts' journal
-- entries, in one statement and so one transaction. Like PostgresStore's
-- batches, each touches 10 accounts, half its events are leased (against the
-- account's funding lease, fencing token 1) and half are overage, half carry
-- the same two dimensions (`model`, `route`; NULL for the others), 1% replay
-- request IDs accepted earlier (`seed_duplicates.sql` accepts them before the
-- first run), and every account the batch changes gets its `usage` journal
-- entry (deltas of `overage` and `billed`, the leases named, the events
-- counted). One script run is one batch of 1000 events.
\set blk random(0, 99)
WITH batch AS (
    SELECT g,
           'acct-' || (:blk * 10 + g % 10 + 1) AS account_id,
           CASE WHEN g <= 990 THEN gen_random_uuid()::text ELSE 'dup-' || g END AS request_id,
           g % 2 = 0 AS leased,
           CASE WHEN g % 4 < 2
                THEN jsonb_build_object('model', 'model-' || g % 5, 'route', '/v1/route-' || g % 3)
           END AS dimensions
    FROM generate_series(1, 1000) AS g
), event AS (
    SELECT b.g, b.account_id, b.request_id, b.dimensions, c.credential_id,
           CASE WHEN b.leased THEN l.lease_id END AS lease_id,
           CASE WHEN b.leased THEN l.fencing_token END AS fencing_token
    FROM batch AS b
    JOIN tollgate_credentials AS c ON c.account_id = b.account_id AND c.revoked_floor_us IS NULL
    JOIN tollgate_leases AS l ON l.account_id = b.account_id AND l.state = 'active' AND l.fencing_token = 1
), inserted AS (
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
                                       occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token,
                                       dimensions)
    SELECT account_id, request_id, credential_id, 1,
           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 0, lease_id, fencing_token, dimensions
    FROM event
    ORDER BY g
    ON CONFLICT (account_id, request_id) DO NOTHING
    RETURNING account_id, credential_id, lease_id, units, occurred_at_floor_us
), lease_update AS (
    UPDATE tollgate_leases AS l
    SET used = l.used + s.units
    FROM (SELECT lease_id, sum(units) AS units FROM inserted WHERE lease_id IS NOT NULL GROUP BY lease_id) AS s
    WHERE l.lease_id = s.lease_id
), credential_update AS (
    UPDATE tollgate_credentials AS c
    SET accepted_events = c.accepted_events + s.events,
        accepted_units = c.accepted_units + s.units,
        last_used_floor_us = greatest(c.last_used_floor_us, s.last_floor_us),
        last_used_submicro_ns = 0
    FROM (SELECT credential_id, count(*) AS events, sum(units) AS units, max(occurred_at_floor_us) AS last_floor_us
          FROM inserted GROUP BY credential_id) AS s
    WHERE c.credential_id = s.credential_id
), account_update AS (
    UPDATE tollgate_accounts AS a
    SET billed = a.billed + s.units, overage = a.overage + s.overage, journal_seq = a.journal_seq + 1
    FROM (SELECT account_id, sum(units) AS units,
                 coalesce(sum(units) FILTER (WHERE lease_id IS NULL), 0) AS overage,
                 count(*) AS events,
                 coalesce(array_agg(DISTINCT lease_id) FILTER (WHERE lease_id IS NOT NULL), '{}') AS leases
          FROM inserted GROUP BY account_id) AS s
    WHERE a.account_id = s.account_id
    RETURNING a.account_id, a.journal_seq, s.units, s.overage, s.events, s.leases
)
INSERT INTO tollgate_journal (account_id, seq, kind, credited, available, reserved, consumed, overage, billed,
                              next_fence, credit_id, lease_id, leases, events, at_floor_us, at_submicro_ns)
SELECT account_id, journal_seq, 'usage', 0, 0, 0, 0, overage, units, 0, NULL, NULL, leases, events,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 0
FROM account_update;
