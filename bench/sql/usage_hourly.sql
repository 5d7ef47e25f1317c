-- The pgbench baseline for usage queries: the hourly units and event counts
-- of one account's accepted events over 30 days, grouped by the `model`
-- dimension, as one hand-written statement. The range is the one the store's
-- side asks for (`crates/tollgate-bench/src/workload.rs`, `usage_range`):
-- [2026-12-16T08:00Z, 2027-01-15T08:00Z), in whole microseconds, so the
-- floor alone decides membership and, every instant being after 1970, plain
-- division gives the bucket. Run with `pgbench -M prepared -c 1`; one script
-- run is one query.
SELECT occurred_at_floor_us / 3600000000 AS bucket,
       dimensions ->> 'model' AS model,
       sum(units) AS units,
       count(*) AS events
FROM tollgate_usage_events
WHERE account_id = 'usage-1'
  AND occurred_at_floor_us >= 1797408000000000
  AND occurred_at_floor_us < 1800000000000000
GROUP BY 1, 2;
