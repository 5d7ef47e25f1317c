-- Settings that every server sharing this database must agree on, such as
-- the reclaim grace, are recorded here so that a server started with a
-- different value can detect the mismatch and refuse to start.
CREATE TABLE tollgate_settings (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
