-- Usage events may carry dimensions (`{"model": "gpt-4o"}`), a JSON object of
-- at most 8 string pairs that the core validated. NULL means none: most
-- events carry none, and NULL costs no storage; `dimensions ->> key` is NULL
-- for such an event as for one without that key, which is the "none" group
-- of a query grouped by a dimension.
ALTER TABLE tollgate_usage_events ADD COLUMN dimensions JSONB NULL;

-- Usage queries and exports read one account's events in a range of
-- occurred_at; exports page in (occurred_at, request_id) order, request ids
-- compared byte by byte (COLLATE "C", the order the memory store keeps), so
-- this one index serves the range scan of both and the export's order.
CREATE INDEX tollgate_usage_events_occurred
    ON tollgate_usage_events (account_id, occurred_at_floor_us, occurred_at_submicro_ns, request_id COLLATE "C");
