-- Hourly totals of accepted usage, so that a usage query over days of an
-- account's events reads a row per hour and group instead of every event.
-- A row holds the units and the number of the account's accepted events of
-- one UTC hour (`hour` is floor(occurred_at_floor_us / 3 600 000 000), floor
-- division before 1970 too), one credential, one funding (`leased`: the
-- event names a lease; otherwise it is overage) and one set of dimensions
-- ('{}' for none). `dimensions_sha256` is the SHA-256 of the dimensions' JSON
-- text, which PostgreSQL spells one way for equal objects; it keys the row,
-- since a set of dimensions may be longer than a B-tree entry allows.
--
-- A trigger adds every inserted event to its row, in the inserting statement,
-- so a row changes exactly when its events commit, whichever binary inserts
-- them: a server older than this migration that is still running during a
-- rollout keeps the totals exact too. Events are never changed or deleted.
-- A query reads whole hours from here and the partial hours at the ends of
-- its range from the events (UsageQuery::hourly_plan in tollgate-core);
-- `tollgate check` compares every row with the events. `units` is NUMERIC,
-- so a sum never overflows, and has no CHECK of its own: the events' guard
-- (0015) keeps their units natural numbers, and the totals repeat what the
-- events hold, so that `check` compares like with like.
CREATE TABLE tollgate_usage_hourly (
    account_id        TEXT NOT NULL,
    hour              BIGINT NOT NULL,
    credential_id     TEXT NOT NULL,
    leased            BOOLEAN NOT NULL,
    dimensions_sha256 BYTEA NOT NULL,
    dimensions        JSONB NOT NULL,
    units             NUMERIC NOT NULL,
    events            BIGINT NOT NULL CHECK (events > 0),
    PRIMARY KEY (account_id, hour, credential_id, leased, dimensions_sha256)
);

-- The hour of an instant's microseconds, floor division before 1970 too
-- (`%` truncates), and the key of a set of dimensions. The trigger, the
-- backfill below and `tollgate check` (CHECK_USAGE_HOURLY_SQL) total events
-- under these two, so all three agree on an event's row.
CREATE FUNCTION tollgate_usage_hour(floor_us BIGINT) RETURNS BIGINT
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (floor_us - (floor_us % 3600000000 + 3600000000) % 3600000000) / 3600000000 $$;
CREATE FUNCTION tollgate_dimensions_sha256(dimensions JSONB) RETURNS BYTEA
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT sha256(convert_to(dimensions::text, 'UTF8')) $$;

-- Adds the statement's inserted events (the transition table `inserted`)
-- to their hours. Rows are ordered by key, so two statements that add to
-- the same rows take their row locks in one order. (Every writer of an
-- account's events also holds the account's row lock.)
CREATE FUNCTION tollgate_usage_hourly_add() RETURNS trigger LANGUAGE plpgsql AS $add$
BEGIN
    INSERT INTO tollgate_usage_hourly AS h
        (account_id, hour, credential_id, leased, dimensions_sha256, dimensions, units, events)
    SELECT u.account_id, tollgate_usage_hour(u.occurred_at_floor_us), u.credential_id,
           u.lease_id IS NOT NULL, tollgate_dimensions_sha256(coalesce(u.dimensions, '{}')),
           coalesce(u.dimensions, '{}'), sum(u.units), count(*)
    FROM inserted u
    GROUP BY 1, 2, 3, 4, 5, 6
    ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (account_id, hour, credential_id, leased, dimensions_sha256)
    DO UPDATE SET units = h.units + excluded.units, events = h.events + excluded.events;
    RETURN NULL;
END
$add$;

-- First the lock: it waits for every transaction still inserting events and
-- holds off new ones until this migration commits, so the events the
-- backfill below reads and those the trigger adds are exactly all of them.
LOCK TABLE tollgate_usage_events IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER tollgate_usage_hourly_add
    AFTER INSERT ON tollgate_usage_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION tollgate_usage_hourly_add();

-- The events already accepted. This reads the whole events table once
-- while ingestion waits (docs/upgrading.md).
INSERT INTO tollgate_usage_hourly
    (account_id, hour, credential_id, leased, dimensions_sha256, dimensions, units, events)
SELECT u.account_id, tollgate_usage_hour(u.occurred_at_floor_us), u.credential_id,
       u.lease_id IS NOT NULL, tollgate_dimensions_sha256(coalesce(u.dimensions, '{}')),
       coalesce(u.dimensions, '{}'), sum(u.units), count(*)
FROM tollgate_usage_events u
GROUP BY 1, 2, 3, 4, 5, 6;
