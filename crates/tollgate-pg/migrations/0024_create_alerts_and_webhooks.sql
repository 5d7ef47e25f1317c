-- Balance alerts and webhooks (tollgate_core::alerts): each account's alert
-- rules, the deployment's webhook endpoints, the events derived from the
-- account journal and their deliveries, and per account the cursor up to
-- which its journal has been derived.
--
-- Events are derived from the journal after commit, in order and once: the
-- deriver reads the entries after an account's cursor and stores their
-- events, their deliveries and the advanced cursor in one transaction. The
-- cursor keeps the account's counters after its last derived entry, since a
-- crossing is judged from the counters before and after each entry.
--
-- Every instant is a (floor_us, submicro_ns) pair, as in the journal, so it
-- round-trips exactly. Every table with an account_id column is keyed by it
-- first (0019), so it can be distributed by account. The endpoints belong to
-- no account: a small table written only by operators, global like
-- tollgate_settings (a reference table on a distributed engine). So that a
-- table distributed by account references no global one, deliveries carry
-- their endpoint's id without a foreign key, and the store deletes an
-- endpoint's deliveries with it, in the same transaction.
--
-- Additive: five new tables, which only servers from this version on read
-- and write; nothing existing changes. tollgate_accounts is locked against
-- writes (SHARE mode: reads go on) while each existing account gets its
-- cursor, so that no counter moves between the counters and the journal_seq
-- the cursor records.
LOCK TABLE tollgate_accounts IN SHARE MODE;

-- `ordinal` numbers an account's rules in creation order (oldest first),
-- whatever the caller's clock said. A threshold is in units, or a percent
-- for available_below_percent; acquire_refused has none. A rule judges the
-- account's entries after from_seq and, once deleted, up to deleted_seq (the
-- account's journal_seq then): entries made while it existed still emit
-- their events however late they are derived. The deriver removes it once
-- its cursor reaches deleted_seq.
CREATE TABLE tollgate_alert_rules (
    account_id          TEXT NOT NULL REFERENCES tollgate_accounts (account_id),
    rule_id             TEXT NOT NULL,
    kind                TEXT NOT NULL CHECK (kind IN ('available_below', 'available_below_percent',
                                                      'overage_above', 'acquire_refused')),
    threshold           BIGINT,
    created_floor_us    BIGINT NOT NULL,
    created_submicro_ns SMALLINT NOT NULL CHECK (created_submicro_ns BETWEEN 0 AND 999),
    from_seq            BIGINT NOT NULL CHECK (from_seq >= 0),
    refused_at_seq      BIGINT CHECK (refused_at_seq >= 0),
    ordinal             BIGINT NOT NULL CHECK (ordinal > 0),
    deleted_seq         BIGINT CHECK (deleted_seq >= from_seq),
    CONSTRAINT tollgate_alert_rules_threshold_by_kind
        CHECK ((threshold IS NULL) = (kind = 'acquire_refused') AND coalesce(threshold, 0) >= 0),
    PRIMARY KEY (account_id, rule_id),
    CONSTRAINT tollgate_alert_rules_ordinal_key UNIQUE (account_id, ordinal)
);

-- The counters (in COUNTER_NAMES order) after journal entry `seq` of the
-- account, the last one derived. An account without a row was created after
-- this migration, so its journal is complete from entry 1: its cursor is 0
-- and a new account's counters.
CREATE TABLE tollgate_outbox_cursors (
    account_id TEXT PRIMARY KEY REFERENCES tollgate_accounts (account_id),
    seq        BIGINT NOT NULL CHECK (seq >= 0),
    credited   BIGINT NOT NULL,
    available  BIGINT NOT NULL,
    reserved   BIGINT NOT NULL,
    consumed   BIGINT NOT NULL,
    overage    BIGINT NOT NULL,
    billed     BIGINT NOT NULL,
    next_fence BIGINT NOT NULL
);

-- The entries up to each account's journal_seq happened before alerts
-- existed: they are not derived.
INSERT INTO tollgate_outbox_cursors (account_id, seq, credited, available, reserved, consumed, overage,
    billed, next_fence)
SELECT a.account_id, a.journal_seq, a.credited, a.available, a.reserved, a.consumed, a.overage,
    a.billed, a.next_fence
FROM tollgate_accounts a;

-- Secrets are sealed by the server (XChaCha20-Poly1305 under its webhook
-- key) before they reach the store: signing needs the secret itself, so it
-- cannot be kept as a hash. previous_secret still signs until
-- previous_secret_until, so receivers can roll over. `ordinal` numbers the
-- endpoints in creation order. An endpoint receives the events whose cause
-- happened at or after its creation (both instants are the servers' clock,
-- which they hold to PostgreSQL's), however late they are derived.
CREATE TABLE tollgate_webhook_endpoints (
    endpoint_id                         TEXT PRIMARY KEY,
    url                                 TEXT NOT NULL,
    event_types                         TEXT[] NOT NULL CHECK (cardinality(event_types) > 0),
    secret                              BYTEA NOT NULL,
    previous_secret                     BYTEA,
    previous_secret_until_floor_us      BIGINT,
    previous_secret_until_submicro_ns   SMALLINT CHECK (previous_secret_until_submicro_ns BETWEEN 0 AND 999),
    created_floor_us                    BIGINT NOT NULL,
    created_submicro_ns                 SMALLINT NOT NULL CHECK (created_submicro_ns BETWEEN 0 AND 999),
    rotated_floor_us                    BIGINT,
    rotated_submicro_ns                 SMALLINT CHECK (rotated_submicro_ns BETWEEN 0 AND 999),
    ordinal                             BIGINT NOT NULL UNIQUE CHECK (ordinal > 0),
    CONSTRAINT tollgate_webhook_endpoints_previous_until_whole
        CHECK ((previous_secret_until_floor_us IS NULL) = (previous_secret_until_submicro_ns IS NULL)),
    CONSTRAINT tollgate_webhook_endpoints_rotated_whole
        CHECK ((rotated_floor_us IS NULL) = (rotated_submicro_ns IS NULL))
);

-- An event is kept once, when an endpoint asks for its type; `body` is the
-- JSON sent, exactly. Its id is a hash of its cause, which names the account.
-- Like the journal, events and deliveries have no foreign key to accounts:
-- they are written only from an existing account's entries or refusals.
CREATE TABLE tollgate_webhook_events (
    account_id          TEXT NOT NULL,
    event_id            TEXT NOT NULL,
    event_type          TEXT NOT NULL,
    body                TEXT NOT NULL,
    created_floor_us    BIGINT NOT NULL,
    created_submicro_ns SMALLINT NOT NULL CHECK (created_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (account_id, event_id)
);

-- One event's delivery to one endpoint. A pending delivery is due at
-- next_attempt; a claim numbers its attempt (attempts) and moves
-- next_attempt past the attempt's timeout, so a claim that lapses leaves it
-- due again. Delivered and failed deliveries have no next attempt.
CREATE TABLE tollgate_webhook_deliveries (
    account_id                TEXT NOT NULL,
    delivery_id               TEXT NOT NULL,
    endpoint_id               TEXT NOT NULL,
    event_id                  TEXT NOT NULL,
    event_type                TEXT NOT NULL,
    state                     TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts                  INT NOT NULL CHECK (attempts >= 0),
    next_attempt_floor_us     BIGINT,
    next_attempt_submicro_ns  SMALLINT CHECK (next_attempt_submicro_ns BETWEEN 0 AND 999),
    last_error                TEXT,
    last_status               INT CHECK (last_status BETWEEN 0 AND 65535),
    created_floor_us          BIGINT NOT NULL,
    created_submicro_ns       SMALLINT NOT NULL CHECK (created_submicro_ns BETWEEN 0 AND 999),
    delivered_floor_us        BIGINT,
    delivered_submicro_ns     SMALLINT CHECK (delivered_submicro_ns BETWEEN 0 AND 999),
    CONSTRAINT tollgate_webhook_deliveries_pending_is_due
        CHECK ((state = 'pending') = (next_attempt_floor_us IS NOT NULL)
               AND (next_attempt_floor_us IS NULL) = (next_attempt_submicro_ns IS NULL)),
    CONSTRAINT tollgate_webhook_deliveries_delivered_whole
        CHECK ((delivered_floor_us IS NULL) = (delivered_submicro_ns IS NULL)),
    PRIMARY KEY (account_id, delivery_id),
    CONSTRAINT tollgate_webhook_deliveries_event_endpoint_key UNIQUE (account_id, event_id, endpoint_id)
);

-- The delivery worker claims pending deliveries in due order.
CREATE INDEX tollgate_webhook_deliveries_due
    ON tollgate_webhook_deliveries (next_attempt_floor_us, next_attempt_submicro_ns, delivery_id)
    WHERE state = 'pending';

-- An endpoint's delivery log, in delivery id (creation) order; also a
-- redelivery and deleting an endpoint's deliveries.
CREATE INDEX tollgate_webhook_deliveries_endpoint
    ON tollgate_webhook_deliveries (endpoint_id, delivery_id);

-- Recording an attempt's result finds the delivery by the id its claim
-- returned.
CREATE INDEX tollgate_webhook_deliveries_id
    ON tollgate_webhook_deliveries (delivery_id);
