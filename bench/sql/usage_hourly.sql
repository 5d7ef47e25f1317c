-- The pgbench baseline for usage queries: the hourly units and event counts
-- of one account's accepted events over 30 days, grouped by the `model`
-- dimension, as one hand-written statement over the hourly totals the
-- schema keeps (migration 0025), the cheapest read of them there is. The
-- range is the one the store's side asks for
-- (`crates/tollgate-bench/src/workload.rs`, `usage_range`):
-- [2026-12-16T08:00Z, 2027-01-15T08:00Z), whole hours, so the store reads
-- only hourly totals too (`UsageQuery::hourly_plan`); every hour being after
-- 1970, the hour is the bucket. Run with `pgbench -M prepared -c 1`; one
-- script run is one query.
SELECT hour AS bucket,
       dimensions ->> 'model' AS model,
       sum(units) AS units,
       sum(events) AS events
FROM tollgate_usage_hourly
WHERE account_id = 'usage-1'
  AND hour >= 1797408000000000 / 3600000000
  AND hour < 1800000000000000 / 3600000000
GROUP BY 1, 2;
