-- The pgbench baseline for the console's account page: the statements its
-- store calls send to PostgreSQL (`crates/tollgate-server/src/console/account.rs`,
-- `read`), in their order, as `crates/tollgate-pg/src/store/sql.rs`,
-- `sql/listings.rs`, `sql/outbox.rs` and `sql/usage_queries.rs` spell them:
-- the account with its active lease count, the first page (100 + 1 rows) of
-- its active leases, of its credentials and of its credits, its alert rules,
-- and the usage chart's totals by bucket and credential: the chart's range
-- is whole hours, so there are no events to read at its two ends and the
-- store sends `USAGE_HOURS_SQL`, every hour read from the hourly totals
-- (migration 0025, `UsageQuery::hourly_plan`). The account, the pages' bounds and the grouping
-- are the bench's literals; the chart's window, which follows the clock, is
-- given by `bench/run` as `-D from_us=… -D to_us=… -D width_us=…` from
-- `tollgate-bench console-setup`. Run with `pgbench -M prepared -c 1` and
-- `PGOPTIONS='-c plan_cache_mode=force_generic_plan'`, the setting the
-- store's connections start with; one script run is one page.
SELECT a.account_id, a.credited, a.available, a.reserved, a.consumed, a.overage, a.billed, a.next_fence,
       (SELECT count(*) FROM tollgate_leases l WHERE l.account_id = 'console-1' AND l.state = 'active') AS active_leases
FROM tollgate_accounts a WHERE a.account_id = 'console-1';
SELECT l.lease_id, l.account_id AS lease_account_id, l.fencing_token, l.capability_hash,
       l.granted, l.used, l.state, l.expiry_floor_us, l.expiry_submicro_ns, l.expiry_is_upper_bound
FROM tollgate_leases l WHERE l.account_id = 'console-1' AND l.lease_id > '' AND l.state = ANY('{active}'::text[])
ORDER BY l.lease_id LIMIT 101;
SELECT c.credential_id, c.account_id AS credential_account_id, c.label, c.key_hash,
       c.created_floor_us, c.created_submicro_ns, c.revoked_floor_us, c.revoked_submicro_ns,
       c.last_used_floor_us, c.last_used_submicro_ns, c.accepted_events, c.accepted_units
FROM tollgate_credentials c WHERE c.account_id = 'console-1' AND c.credential_id > ''
ORDER BY c.credential_id LIMIT 101;
SELECT c.credit_id, c.units FROM tollgate_credits c
WHERE c.account_id = 'console-1' AND c.credit_id > '' ORDER BY c.credit_id LIMIT 101;
SELECT r.account_id, r.rule_id, r.kind, r.threshold, r.created_floor_us, r.created_submicro_ns,
       r.from_seq, r.refused_at_seq, r.deleted_seq
FROM tollgate_alert_rules r WHERE r.account_id = 'console-1' AND r.deleted_seq IS NULL ORDER BY r.ordinal;
SELECT g.bucket, g.group_key, sum(g.units)::text, sum(g.events)::text FROM (
    SELECT CASE WHEN :width_us::int8 IS NULL THEN 0::int8
                ELSE ((h.hour * 3600000000) - ((h.hour * 3600000000) % :width_us::int8 + :width_us::int8) % :width_us::int8) / :width_us::int8
           END AS bucket,
           CASE 'credential'::text WHEN 'credential' THEN h.credential_id WHEN 'lease' THEN NULL::text
                WHEN 'funding' THEN CASE WHEN h.leased THEN 'leased' ELSE 'overage' END
                WHEN 'dimension' THEN h.dimensions ->> NULL::text END AS group_key,
           h.units, h.events
    FROM tollgate_usage_hourly h
    WHERE (:from_us::int8 / 3600000000) IS NOT NULL AND h.account_id = 'console-1'
      AND h.hour >= :from_us::int8 / 3600000000 AND h.hour < :to_us::int8 / 3600000000
) g GROUP BY g.bucket, g.group_key;
