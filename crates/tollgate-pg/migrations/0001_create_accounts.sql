-- Accounts hold prepaid units. The first counters are the ones the first
-- release needed (credit, spend); every counter is a natural number, so the
-- database refuses a negative balance even if a writer has a bug.
CREATE TABLE tollgate_accounts (
    account_id TEXT PRIMARY KEY,
    credited   BIGINT NOT NULL DEFAULT 0 CHECK (credited >= 0),
    available  BIGINT NOT NULL DEFAULT 0 CHECK (available >= 0),
    consumed   BIGINT NOT NULL DEFAULT 0 CHECK (consumed >= 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
