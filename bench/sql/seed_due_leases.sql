-- Seeds 100 000 due leases (100 on each of the 1000 benchmark accounts), with
-- expiries in 2020 and some usage recorded, and the account counters that
-- granting and using them implies, so that the conservation equations hold.
-- Both sides of the reclaim pair start from this state.
WITH seeded AS (
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, used,
                                 state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    SELECT 'due_' || replace(gen_random_uuid()::text, '-', ''), a.account_id, a.next_fence + k,
           sha256(uuid_send(gen_random_uuid())), 2, k % 3, 'active', 1577836800000000 + k, k % 1000, FALSE
    FROM tollgate_accounts AS a, generate_series(0, 99) AS k
    WHERE a.account_id LIKE 'acct-%'
    RETURNING account_id, granted, used
)
UPDATE tollgate_accounts AS a
SET available = a.available - s.granted,
    reserved = a.reserved + s.granted,
    billed = a.billed + s.used,
    next_fence = a.next_fence + 100
FROM (SELECT account_id, sum(granted) AS granted, sum(used) AS used FROM seeded GROUP BY account_id) AS s
WHERE a.account_id = s.account_id;
