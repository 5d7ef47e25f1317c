-- Revocation keeps the row (and its activity) for audit; the revoked instant
-- is null while the key is live.
ALTER TABLE tollgate_credentials
    ADD COLUMN revoked_floor_us    BIGINT NULL,
    ADD COLUMN revoked_submicro_ns SMALLINT NULL;
