-- Lease expiries become exact nanosecond instants, stored as the pair
-- (expiry_floor_us, expiry_submicro_ns) = 1000 * floor_us + submicro_ns ns,
-- whose tuple order is instant order, before the epoch included.
--
-- This whole file is one transaction (sqlx wraps each migration in one), so a
-- failure anywhere, including an out-of-domain legacy row, rolls back every
-- change here and leaves 0016 authoritative.
--
-- The explicit lock makes the cut-over atomic for every lease writer: running
-- old transactions finish first, and nothing sees the new format before
-- commit. Lock wait and backfill time grow with the table.
LOCK TABLE tollgate_leases IN ACCESS EXCLUSIVE MODE;

-- The rename is the compatibility fence: any pre-0017 lease statement now
-- fails with undefined_column (42703), including on a connection opened
-- before this migration, so an old binary can never reclaim early.
ALTER TABLE tollgate_leases RENAME COLUMN expires_at_us TO expiry_floor_us;

-- No default for either column: every writer states the remainder and
-- whether the instant is exact (new grants write false).
ALTER TABLE tollgate_leases
    ADD COLUMN expiry_submicro_ns SMALLINT,
    ADD COLUMN expiry_is_upper_bound BOOLEAN;

-- Legacy writers truncated toward zero, so the true expiry is unknown. Record
-- the latest instant consistent with the stored value: +999 ns for
-- nonnegative microseconds, the stored instant itself for negative ones. This
-- never makes an advertised expiry earlier; the marker keeps the uncertainty
-- inspectable, on settled history too. No unit, fence, state or accounting
-- field changes.
UPDATE tollgate_leases
SET expiry_submicro_ns = CASE WHEN expiry_floor_us >= 0 THEN 999 ELSE 0 END,
    expiry_is_upper_bound = TRUE;

ALTER TABLE tollgate_leases
    ALTER COLUMN expiry_submicro_ns SET NOT NULL,
    ALTER COLUMN expiry_is_upper_bound SET NOT NULL;

-- The complete jiff Timestamp domain, -377705023201 s ..= 253402207200.999999999 s.
-- These are validated now, against every row: an out-of-domain legacy expiry
-- fails the migration instead of being clamped to an invented instant.
ALTER TABLE tollgate_leases
    ADD CONSTRAINT tollgate_leases_expiry_floor_in_domain
        CHECK (expiry_floor_us BETWEEN -377705023201000000 AND 253402207200999999),
    ADD CONSTRAINT tollgate_leases_expiry_submicro_range
        CHECK (expiry_submicro_ns BETWEEN 0 AND 999);

-- Reclaim compares (floor_us, submicro_ns) tuples against an exact cutoff,
-- so the partial index must cover both components.
DROP INDEX tollgate_leases_active_expiry;
CREATE INDEX tollgate_leases_active_expiry
    ON tollgate_leases (expiry_floor_us, expiry_submicro_ns)
    WHERE state = 'active';
