-- Accepted usage events. The primary key is what makes ingestion idempotent:
-- an accepted event claims its (account, request_id) forever. Funding is a
-- lease and its fencing token together, or neither for overage usage.
CREATE TABLE tollgate_usage_events (
    account_id              TEXT NOT NULL,
    request_id              TEXT NOT NULL,
    credential_id           TEXT NOT NULL,
    units                   BIGINT NOT NULL,
    occurred_at_floor_us    BIGINT NOT NULL,
    occurred_at_submicro_ns SMALLINT NOT NULL,
    lease_id                TEXT NULL,
    fencing_token           BIGINT NULL,
    recorded_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, request_id),
    CONSTRAINT tollgate_usage_events_funding_all_or_nothing
        CHECK ((lease_id IS NULL) = (fencing_token IS NULL))
);
