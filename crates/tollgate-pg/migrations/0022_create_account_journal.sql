-- The account journal: one row per change to an account's counters, numbered
-- 1, 2, 3, ... per account with no gaps (tollgate_core::journal). The
-- statement that changes an account's counters also increments its
-- journal_seq and inserts the entry numbered by it, so an entry exists
-- exactly when its change committed, and no operation needs another round
-- trip for it.
--
-- Deltas are the signed change of each counter, in COUNTER_NAMES order.
-- Counters are BIGINT >= 0, so every delta fits a BIGINT. Which ids an entry
-- names depends on its kind (docs/rules.md, The account journal); a usage
-- entry counts its accepted events rather than naming them.
--
-- Accounts that exist now have history the journal never saw: each gets one
-- 'opening' entry whose deltas are its counters minus those of a new account
-- (next_fence starts at 1), so replaying any journal from its first entry,
-- starting from a new account's counters, gives the account's counters.
--
-- An entry is only ever inserted by the statement that updates its account
-- row, from that update's RETURNING, so its account always exists; like the
-- usage events, the table has no foreign key, which would add a referential
-- check to every hot-path write.
--
-- The accounts table is locked for the whole migration, so no counter moves
-- between the opening entries and the journal_seq they set.
LOCK TABLE tollgate_accounts IN ACCESS EXCLUSIVE MODE;

ALTER TABLE tollgate_accounts
    ADD COLUMN journal_seq BIGINT NOT NULL DEFAULT 0
        CONSTRAINT tollgate_accounts_journal_seq_nonnegative CHECK (journal_seq >= 0);

CREATE TABLE tollgate_journal (
    account_id     TEXT NOT NULL,
    seq            BIGINT NOT NULL CHECK (seq > 0),
    kind           TEXT NOT NULL CHECK (kind IN ('opening', 'credit', 'acquire', 'release', 'reclaim',
                                                  'consolidate', 'usage')),
    credited       BIGINT NOT NULL,
    available      BIGINT NOT NULL,
    reserved       BIGINT NOT NULL,
    consumed       BIGINT NOT NULL,
    overage        BIGINT NOT NULL,
    billed         BIGINT NOT NULL,
    next_fence     BIGINT NOT NULL,
    credit_id      TEXT,
    lease_id       TEXT,
    leases         TEXT[] NOT NULL DEFAULT '{}',
    events         BIGINT CHECK (events >= 0),
    at_floor_us    BIGINT NOT NULL,
    at_submicro_ns SMALLINT NOT NULL CHECK (at_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (account_id, seq)
);

INSERT INTO tollgate_journal (account_id, seq, kind, credited, available, reserved, consumed, overage,
    billed, next_fence, at_floor_us, at_submicro_ns)
SELECT a.account_id, 1, 'opening', a.credited, a.available, a.reserved, a.consumed, a.overage, a.billed,
    a.next_fence - 1, (extract(epoch FROM now()) * 1000000)::int8, 0
FROM tollgate_accounts a;

UPDATE tollgate_accounts SET journal_seq = 1;
