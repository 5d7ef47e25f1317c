-- Leases let a gateway spend units locally. Units granted to a live lease are
-- moved from available to reserved, and each lease carries a fencing token
-- drawn from the account's next_fence so that a stale worker can be refused.
-- Expiry is stored in whole microseconds since the epoch; writers of this
-- era truncate the fractional microsecond toward zero.
ALTER TABLE tollgate_accounts
    ADD COLUMN reserved   BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    ADD COLUMN next_fence BIGINT NOT NULL DEFAULT 1;

CREATE TABLE tollgate_leases (
    lease_id        TEXT PRIMARY KEY,
    account_id      TEXT NOT NULL REFERENCES tollgate_accounts (account_id),
    fencing_token   BIGINT NOT NULL,
    capability_hash BYTEA NOT NULL,
    granted         BIGINT NOT NULL CHECK (granted >= 0),
    used            BIGINT NOT NULL DEFAULT 0 CHECK (used >= 0),
    state           TEXT NOT NULL
        CONSTRAINT tollgate_leases_state_check CHECK (state IN ('active', 'released', 'reclaimed')),
    expires_at_us   BIGINT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
