-- End-user API keys. Only a hash of the key is kept, and it is unique so that
-- verification is a single index lookup. Instants are stored as an exact
-- (floor microseconds, sub-microsecond nanoseconds) pair.
CREATE TABLE tollgate_credentials (
    credential_id       TEXT PRIMARY KEY,
    account_id          TEXT NOT NULL REFERENCES tollgate_accounts (account_id),
    label               TEXT NOT NULL,
    key_hash            BYTEA NOT NULL UNIQUE,
    created_floor_us    BIGINT NOT NULL,
    created_submicro_ns SMALLINT NOT NULL
);
