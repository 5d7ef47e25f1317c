-- Credits are keyed by a caller-chosen credit_id so that a retried top-up is
-- idempotent: the primary key turns a replay into ON CONFLICT DO NOTHING.
CREATE TABLE tollgate_credits (
    account_id TEXT REFERENCES tollgate_accounts (account_id),
    credit_id  TEXT,
    units      BIGINT NOT NULL CHECK (units > 0),
    created_at TIMESTAMPTZ DEFAULT now(),
    PRIMARY KEY (account_id, credit_id)
);
