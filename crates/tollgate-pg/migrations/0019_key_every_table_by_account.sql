-- Every primary key and unique constraint leads with account_id, so that each
-- per-account table can be distributed (or hash-partitioned) by account: a
-- distributed engine, like PostgreSQL's own partitioning, can enforce a
-- uniqueness only when it includes the distribution column. Accounts, credits,
-- usage events and idempotency keys were keyed this way already; leases and
-- credentials were keyed by their own ids. tollgate_settings is global (a
-- reference table on a distributed engine) and keeps its key.
--
-- Lease and credential ids are drawn at random, so no stored pair can collide
-- and no row changes here; only the indexes are rebuilt. No foreign key
-- references a lease or a credential, and those referencing accounts use its
-- key, which is unchanged.
--
-- Both tables are locked for the whole migration (one transaction), while
-- their unique indexes are rebuilt; the time grows with the rows stored.
LOCK TABLE tollgate_leases, tollgate_credentials IN ACCESS EXCLUSIVE MODE;

ALTER TABLE tollgate_leases
    DROP CONSTRAINT tollgate_leases_pkey,
    ADD CONSTRAINT tollgate_leases_pkey PRIMARY KEY (account_id, lease_id);

-- A credential key is unique within its account. Keys carry 256 random bits,
-- so a collision between accounts is as unlikely as one within an account.
ALTER TABLE tollgate_credentials
    DROP CONSTRAINT tollgate_credentials_pkey,
    DROP CONSTRAINT tollgate_credentials_key_hash_key,
    ADD CONSTRAINT tollgate_credentials_pkey PRIMARY KEY (account_id, credential_id),
    ADD CONSTRAINT tollgate_credentials_account_key_hash_key UNIQUE (account_id, key_hash);

-- The primary key now leads with account_id and serves listing an account's
-- credentials (0014's purpose) by itself.
DROP INDEX tollgate_credentials_account;
