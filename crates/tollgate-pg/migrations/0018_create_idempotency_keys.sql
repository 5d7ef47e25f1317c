-- Answers of requests sent with an Idempotency-Key, so that a retry is
-- answered with the original answer instead of a second effect. A row is
-- written in the same transaction as the effect it answers.
--
-- Nothing here reveals the request or its answer without the key: lookup_id
-- and fingerprint are SHA-256 derivations of the key, its scope and (for the
-- fingerprint) the request's arguments, and sealed_answer is the answer
-- encrypted under a third derivation. account_id is the account the scoped
-- resource belongs to, so the table distributes by account like every other;
-- it has no foreign key because the row is claimed before the operation has
-- established that the account exists (a refused operation rolls it back).
CREATE TABLE tollgate_idempotency_keys (
    account_id          TEXT NOT NULL,
    lookup_id           BYTEA NOT NULL CHECK (octet_length(lookup_id) = 32),
    fingerprint         BYTEA NOT NULL CHECK (octet_length(fingerprint) = 32),
    sealed_answer       BYTEA NOT NULL,
    created_floor_us    BIGINT NOT NULL,
    created_submicro_ns SMALLINT NOT NULL CHECK (created_submicro_ns BETWEEN 0 AND 999),
    expires_floor_us    BIGINT NOT NULL,
    expires_submicro_ns SMALLINT NOT NULL CHECK (expires_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (account_id, lookup_id)
);

-- The purge takes expired rows in expiry order.
CREATE INDEX tollgate_idempotency_keys_expiry
    ON tollgate_idempotency_keys (expires_floor_us, expires_submicro_ns);
