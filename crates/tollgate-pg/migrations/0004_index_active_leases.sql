-- The reclaim worker scans active leases by expiry and the account view sums
-- active grants per account; both only ever look at active rows, so partial
-- indexes stay small however much settled history accumulates.
CREATE INDEX tollgate_leases_active_expiry
    ON tollgate_leases (expires_at_us)
    WHERE state = 'active';

CREATE INDEX tollgate_leases_active_account
    ON tollgate_leases (account_id)
    WHERE state = 'active';
