-- A reclaim pass settles the due leases of the accounts of the most overdue
-- leases, each account's in expiry order (ReclaimPass::accounts in
-- tollgate-core), so it reads an account's active leases in
-- (expiry, lease_id) order. This index serves that read in order, and also
-- every read of an account's active leases by account_id alone (the account
-- view's count), which the index it replaces served: one index per active
-- lease either way, so acquire and release maintain no more entries than
-- before.
--
-- Built without CONCURRENTLY, so it holds a lock that blocks writes to
-- tollgate_leases while it builds; the partial index covers active leases
-- only, which a running deployment keeps few of (docs/upgrading.md).
CREATE INDEX tollgate_leases_active_account_expiry
    ON tollgate_leases (account_id, expiry_floor_us, expiry_submicro_ns, lease_id)
    WHERE state = 'active';

DROP INDEX tollgate_leases_active_account;
