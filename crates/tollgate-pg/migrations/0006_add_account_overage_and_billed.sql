-- Usage beyond a grant is billed as overage instead of being dropped, and
-- billed counts every accepted unit; both are monotonic natural numbers.
ALTER TABLE tollgate_accounts
    ADD COLUMN overage BIGINT NOT NULL DEFAULT 0 CHECK (overage >= 0),
    ADD COLUMN billed  BIGINT NOT NULL DEFAULT 0 CHECK (billed >= 0);
