-- Usage units are natural numbers and fencing tokens are positive; no
-- legitimate writer ever stored anything else. The guards are installed NOT
-- VALID so that this migration takes only brief exclusive locks for the
-- catalogue change and does not scan usage history under them; from now on
-- they check every new write. 0016 validates the existing rows separately.
--
-- Inspect existing data before deploying (read-only):
--   SELECT request_id, units, fencing_token FROM tollgate_usage_events
--   WHERE units < 0 OR fencing_token <= 0;
--   SELECT lease_id, fencing_token FROM tollgate_leases WHERE fencing_token <= 0;
--   SELECT account_id, next_fence FROM tollgate_accounts WHERE next_fence <= 0;
ALTER TABLE tollgate_usage_events
    ADD CONSTRAINT tollgate_usage_events_units_nonnegative
        CHECK (units >= 0) NOT VALID,
    ADD CONSTRAINT tollgate_usage_events_fence_positive
        CHECK (fencing_token IS NULL OR fencing_token > 0) NOT VALID;

ALTER TABLE tollgate_leases
    ADD CONSTRAINT tollgate_leases_fence_positive
        CHECK (fencing_token > 0) NOT VALID;

ALTER TABLE tollgate_accounts
    ADD CONSTRAINT tollgate_accounts_next_fence_positive
        CHECK (next_fence > 0) NOT VALID;
