-- Listing an account's credentials filters on the foreign key column, and
-- PostgreSQL does not index a referencing column by itself.
CREATE INDEX tollgate_credentials_account
    ON tollgate_credentials (account_id);
