-- Credential activity is derived from accepted usage only, so operators can
-- see when a key was last used and how much it consumed without scanning the
-- event history.
ALTER TABLE tollgate_credentials
    ADD COLUMN last_used_floor_us    BIGINT NULL,
    ADD COLUMN last_used_submicro_ns SMALLINT NULL,
    ADD COLUMN accepted_events       BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN accepted_units        BIGINT NOT NULL DEFAULT 0;
