-- Operators asked when a lease was settled, not only how; null while active.
ALTER TABLE tollgate_leases
    ADD COLUMN settled_at TIMESTAMPTZ NULL;
