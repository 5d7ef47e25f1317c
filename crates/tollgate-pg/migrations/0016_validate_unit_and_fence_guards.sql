-- Validate the 0015 guards against existing history. This runs in its own
-- transaction and VALIDATE CONSTRAINT takes only SHARE UPDATE EXCLUSIVE, so
-- ordinary reads and writes continue during the scan.
--
-- If a historical row violates a guard, this migration fails, 0015 stays
-- committed and keeps checking new writes, and startup is refused. Reconcile
-- the offending rows from authoritative usage and lease evidence, then start
-- again. Do not clamp units, invent fences, drop guards or delete migration
-- history to make it pass.
ALTER TABLE tollgate_usage_events
    VALIDATE CONSTRAINT tollgate_usage_events_units_nonnegative;
ALTER TABLE tollgate_usage_events
    VALIDATE CONSTRAINT tollgate_usage_events_fence_positive;
ALTER TABLE tollgate_leases
    VALIDATE CONSTRAINT tollgate_leases_fence_positive;
ALTER TABLE tollgate_accounts
    VALIDATE CONSTRAINT tollgate_accounts_next_fence_positive;
