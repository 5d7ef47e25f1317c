-- The reclaim baseline: one set-based statement that settles every due lease
-- (expiry + 30 s grace <= now, compared as exact (floor_us, submicro_ns)
-- tuples) and applies the settlements to the accounts, in one transaction.
WITH due AS (
    UPDATE tollgate_leases
    SET state = 'reclaimed', settled_at = now()
    WHERE state = 'active'
      AND (expiry_floor_us, expiry_submicro_ns)
          <= ((extract(epoch FROM clock_timestamp()) * 1000000)::bigint - 30000000, 0)
    RETURNING account_id, granted, used
), totals AS (
    SELECT account_id,
           sum(granted) AS granted,
           sum(least(used, granted)) AS charged,
           sum(greatest(used - granted, 0)) AS excess
    FROM due
    GROUP BY account_id
)
UPDATE tollgate_accounts AS a
SET available = a.available + t.granted - t.charged,
    reserved = a.reserved - t.granted,
    consumed = a.consumed + t.charged,
    overage = a.overage + t.excess
FROM totals AS t
WHERE a.account_id = t.account_id;
