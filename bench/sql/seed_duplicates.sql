-- Accepts the request IDs `dup-991` … `dup-1000` as overage usage on every
-- benchmark account, with the counter updates acceptance makes, so that every
-- baseline ingestion batch replays exactly 1% of its events.
WITH inserted AS (
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
                                       occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token)
    SELECT c.account_id, 'dup-' || g, c.credential_id, 1,
           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 0, NULL, NULL
    FROM tollgate_credentials AS c, generate_series(991, 1000) AS g
    ON CONFLICT (account_id, request_id) DO NOTHING
    RETURNING account_id, credential_id, units, occurred_at_floor_us
), credential_update AS (
    UPDATE tollgate_credentials AS c
    SET accepted_events = c.accepted_events + s.events,
        accepted_units = c.accepted_units + s.units,
        last_used_floor_us = greatest(c.last_used_floor_us, s.last_floor_us),
        last_used_submicro_ns = 0
    FROM (SELECT credential_id, count(*) AS events, sum(units) AS units, max(occurred_at_floor_us) AS last_floor_us
          FROM inserted GROUP BY credential_id) AS s
    WHERE c.credential_id = s.credential_id
)
UPDATE tollgate_accounts AS a
SET billed = a.billed + s.units, overage = a.overage + s.units
FROM (SELECT account_id, sum(units) AS units FROM inserted GROUP BY account_id) AS s
WHERE a.account_id = s.account_id;
