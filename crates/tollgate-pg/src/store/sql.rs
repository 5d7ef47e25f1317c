//! Every SQL statement the store runs, each a named constant, kept apart from
//! the code that binds and runs it.
//!
//! Column lists are spelled once, as the macros below, and statements are
//! assembled from them with `concat!`, so each statement is one `&'static str`
//! that PostgreSQL prepares once per connection: nothing here is built at run
//! time. The account counters follow `tollgate_core::COUNTER_NAMES`; the
//! statements that compare, store or add all seven bind them as one `int8[]`
//! in that order and take its elements by subscript, so a reordered array
//! cannot bind to the wrong column unnoticed (`tests` checks the lists
//! against `COUNTER_NAMES`).
//!
//! Every statement is parameterised and names its columns.
//!
//! The statements that change an account's counters also write its journal,
//! and live in `sql/journal.rs`.
//!
//! Statements of one feature may live in a file of `sql/`, declared at the end
//! of this file and re-exported from it; their constants are
//! `pub(in crate::store)`, and `tests/pg/partitioning.rs` reads those files too.

/// The seven account counter columns, in `COUNTER_NAMES` order, each after
/// `$prefix` (a table alias).
macro_rules! counters {
    ($p:literal) => {
        concat!(
            $p,
            "credited, ",
            $p,
            "available, ",
            $p,
            "reserved, ",
            $p,
            "consumed, ",
            $p,
            "overage, ",
            $p,
            "billed, ",
            $p,
            "next_fence"
        )
    };
}

/// The seven elements of the counter array `$array`, in `COUNTER_NAMES` order.
macro_rules! elements {
    ($a:literal) => {
        concat!($a, "[1], ", $a, "[2], ", $a, "[3], ", $a, "[4], ", $a, "[5], ", $a, "[6], ", $a, "[7]")
    };
}

/// Assignments of the seven counters to the elements of `$array`.
macro_rules! assign_elements {
    ($a:literal) => {
        concat!(
            "credited = ",
            $a,
            "[1], available = ",
            $a,
            "[2], reserved = ",
            $a,
            "[3], consumed = ",
            $a,
            "[4], overage = ",
            $a,
            "[5], billed = ",
            $a,
            "[6], next_fence = ",
            $a,
            "[7]"
        )
    };
}

/// Assignments adding the elements of `$array` to the seven counters of `a`.
macro_rules! add_elements {
    ($a:literal) => {
        concat!(
            "credited = a.credited + ",
            $a,
            "[1], available = a.available + ",
            $a,
            "[2], reserved = a.reserved + ",
            $a,
            "[3], consumed = a.consumed + ",
            $a,
            "[4], overage = a.overage + ",
            $a,
            "[5], billed = a.billed + ",
            $a,
            "[6], next_fence = a.next_fence + ",
            $a,
            "[7]"
        )
    };
}

macro_rules! account_columns {
    () => {
        concat!("a.account_id, ", counters!("a."))
    };
}
macro_rules! lease_columns {
    () => {
        "l.lease_id, l.account_id AS lease_account_id, l.fencing_token, l.capability_hash, \
         l.granted, l.used, l.state, l.expiry_floor_us, l.expiry_submicro_ns, \
         l.expiry_is_upper_bound"
    };
}
macro_rules! credential_columns {
    () => {
        "c.credential_id, c.account_id AS credential_account_id, c.label, c.key_hash, \
         c.created_floor_us, c.created_submicro_ns, c.revoked_floor_us, c.revoked_submicro_ns, \
         c.last_used_floor_us, c.last_used_submicro_ns, c.accepted_events, c.accepted_units"
    };
}

/// Whether the lease row `$p` (a table alias and dot) decodes: the
/// conditions of `LeaseRow::decode` (`rows.rs`), as SQL, for a statement that
/// settles leases without sending them to the client first. `$floor_min` and
/// `$floor_max` are the parameters bound to the core's `FLOOR_US_MIN` and
/// `FLOOR_US_MAX`. A lease row with any other state than `active` is never
/// read by such a statement. `tests/pg/store.rs` breaks a due lease in each
/// way `decode` refuses and holds such a pass to the same report.
macro_rules! lease_decodes {
    ($p:literal, $floor_min:literal, $floor_max:literal) => {
        concat!(
            "(",
            $p,
            "fencing_token > 0 AND ",
            $p,
            "granted >= 0 AND ",
            $p,
            "used >= 0 AND octet_length(",
            $p,
            "capability_hash) = 32 AND ",
            $p,
            "expiry_submicro_ns BETWEEN 0 AND 999 AND ",
            $p,
            "expiry_floor_us BETWEEN ",
            $floor_min,
            " AND ",
            $floor_max,
            ")"
        )
    };
}

/// Whether the account row `$p` decodes: `AccountRow::decode`'s conditions,
/// as SQL (every counter nonnegative, `next_fence` positive).
macro_rules! account_decodes {
    ($p:literal) => {
        concat!("(least(", counters!($p), ") >= 0 AND ", $p, "next_fence > 0)")
    };
}

/// A reclaim pass's accounts (`READ_DUE_SQL`, `RECLAIM_DUE_SQL`): the CTEs
/// `most_overdue`, the $4 most overdue leases due at ($1, $2), numbered in
/// `(expiry, lease_id)` order, and `heads`, their accounts in the order of
/// their most overdue one.
macro_rules! reclaim_heads {
    () => {
        "most_overdue AS (
    SELECT l.account_id,
        row_number() OVER (ORDER BY l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id) AS n
    FROM tollgate_leases AS l
    WHERE l.state = 'active' AND (l.expiry_floor_us, l.expiry_submicro_ns) <= ($1, $2)
    ORDER BY l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id
    LIMIT $4
), heads AS (
    SELECT m.account_id, min(m.n) AS first
    FROM most_overdue AS m
    GROUP BY m.account_id
    ORDER BY first
)"
    };
}

/// Each of `reclaim_heads!`'s accounts (`h`) with its due leases (`l`, the
/// columns `$columns` of `d`), at most $3 of them, in expiry order, read
/// through the account's range of `tollgate_leases_active_account_expiry`.
macro_rules! heads_due_leases {
    ($columns:literal) => {
        concat!(
            "heads AS h
CROSS JOIN LATERAL (
    SELECT ",
            $columns,
            "
    FROM tollgate_leases AS d
    WHERE d.account_id = h.account_id AND d.state = 'active'
      AND (d.expiry_floor_us, d.expiry_submicro_ns) <= ($1, $2)
    ORDER BY d.expiry_floor_us, d.expiry_submicro_ns, d.lease_id
    LIMIT $3
) AS l"
        )
    };
}

/// A lease with its account, for the reads that settle it.
macro_rules! held_lease_select {
    () => {
        concat!(
            "SELECT ",
            account_columns!(),
            ", ",
            lease_columns!(),
            " FROM tollgate_leases l JOIN tollgate_accounts a ON a.account_id = l.account_id"
        )
    };
}

/// The names under which `RELEASE_*_IF_UNCHANGED_SQL` return the account's
/// counters as written, in `COUNTER_NAMES` order.
pub(super) const WRITTEN_COUNTER_NAMES: [&str; 7] = [
    "written_credited",
    "written_available",
    "written_reserved",
    "written_consumed",
    "written_overage",
    "written_billed",
    "written_next_fence",
];

// ------------------------------------------------------------- transactions

/// A transaction's control statements, which `Tx` sends.
pub(super) const BEGIN_SQL: &str = "BEGIN";
pub(super) const COMMIT_SQL: &str = "COMMIT";
pub(super) const ROLLBACK_SQL: &str = "ROLLBACK";

// ----------------------------------------------------------------- accounts

/// A new account with the core's initial counters ($2, in `COUNTER_NAMES`
/// order); nothing when it exists.
pub(super) const CREATE_ACCOUNT_SQL: &str = concat!(
    "INSERT INTO tollgate_accounts (account_id, ",
    counters!(""),
    ") VALUES ($1, ",
    elements!("$2"),
    ") ON CONFLICT (account_id) DO NOTHING"
);

pub(super) const READ_ACCOUNT_SQL: &str =
    concat!("SELECT ", account_columns!(), " FROM tollgate_accounts a WHERE a.account_id = $1");

pub(super) const LOCK_ACCOUNT_SQL: &str =
    concat!("SELECT ", account_columns!(), " FROM tollgate_accounts a WHERE a.account_id = $1 FOR NO KEY UPDATE");

pub(super) const LOCK_ACCOUNTS_SQL: &str = concat!(
    "SELECT ",
    account_columns!(),
    " FROM tollgate_accounts a WHERE a.account_id = ANY($1) ORDER BY a.account_id FOR NO KEY UPDATE"
);

pub(super) const LOCK_ACCOUNTS_SKIP_LOCKED_SQL: &str = concat!(
    "SELECT ",
    account_columns!(),
    " FROM tollgate_accounts a WHERE a.account_id = ANY($1) ORDER BY a.account_id \
     FOR NO KEY UPDATE SKIP LOCKED"
);

/// An account with its count of active leases.
pub(super) const ACCOUNT_VIEW_SQL: &str = concat!(
    "SELECT ",
    account_columns!(),
    ", (SELECT count(*) FROM tollgate_leases l \
        WHERE l.account_id = $1 AND l.state = 'active') AS active_leases \
     FROM tollgate_accounts a WHERE a.account_id = $1"
);

/// A credit already recorded under the id, and the account's active leases.
/// Runs after the account's lock, so a concurrent credit with this id is seen.
pub(super) const CREDIT_RECORDED_SQL: &str = "SELECT (SELECT c.units FROM tollgate_credits c WHERE c.account_id = $1 AND c.credit_id = $2), \
        (SELECT count(*) FROM tollgate_leases l WHERE l.account_id = $1 AND l.state = 'active')";

// ------------------------------------------------------------------- leases

/// The lease $2 of the account $1. Every statement that finds a lease by its
/// id names its account too, so each touches one account.
pub(super) const READ_LEASE_SQL: &str =
    concat!("SELECT ", lease_columns!(), " FROM tollgate_leases l WHERE l.account_id = $1 AND l.lease_id = $2");

/// Leases among $2 of the account $1, in `lease_id` order: a consolidation's
/// sources.
pub(super) const LOCK_ACCOUNT_LEASES_SQL: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM tollgate_leases l WHERE l.account_id = $1 AND l.lease_id = ANY($2) \
     ORDER BY l.lease_id FOR UPDATE"
);

/// Leases among $1 that belong to the accounts $2, in `lease_id` order.
pub(super) const LOCK_LEASES_SQL: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM tollgate_leases l WHERE l.lease_id = ANY($1) AND l.account_id = ANY($2) \
     ORDER BY l.lease_id FOR UPDATE"
);

/// The lease $2 of the account $1, with the account.
pub(super) const READ_HELD_LEASE_SQL: &str =
    concat!(held_lease_select!(), " WHERE l.account_id = $1 AND l.lease_id = $2");

/// One locking read for a lease and its account; the OF clauses lock the
/// account before the lease, the global lock order.
pub(super) const LOCK_HELD_LEASE_SQL: &str = concat!(
    held_lease_select!(),
    " WHERE l.account_id = $1 AND l.lease_id = $2 FOR NO KEY UPDATE OF a FOR UPDATE OF l"
);

/// Active leases due at the cutoff ($1, $2), at most $3, with their accounts,
/// in the order a reclaim pass takes them (`ReclaimPass::accounts`): the
/// accounts of the $4 most overdue leases, in the order of their most overdue
/// one, each with its due leases in expiry order. The accounts' leases are
/// read through `tollgate_leases_active_account_expiry` in that order, so the
/// statement reads about as many rows as it returns. Each row also carries
/// how many of those $4 most overdue leases there were (`considered`).
///
/// Accounts in the order of their most overdue lease are the same accounts,
/// in the same order, however many of the most overdue leases are looked at:
/// looking at more only adds accounts after them. So with $4 below $3 the
/// rows are the first rows of the statement with $4 = $3 whenever there are
/// $3 of them or fewer than $4 leases were considered (`read_due_rows`), and the
/// statement visits the rows of only $4 leases to find its accounts, where
/// the most overdue ones of a large backlog are spread over as many heap
/// pages as there are accounts.
pub(super) const READ_DUE_SQL: &str = concat!(
    "
WITH ",
    reclaim_heads!(),
    "
SELECT (SELECT count(*) FROM most_overdue) AS considered, ",
    account_columns!(),
    ", ",
    lease_columns!(),
    "
FROM ",
    heads_due_leases!("d.*"),
    "
JOIN tollgate_accounts AS a ON a.account_id = l.account_id
ORDER BY h.first, l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id
LIMIT $3"
);

/// Locks, skipping those another transaction holds, the leases $2 of the
/// accounts $1 (pairwise) that are still active and due at ($3, $4), in
/// account and then lease order: the locking reclaim pass's leases, chosen
/// by `READ_DUE_SQL`. The join alone names the rows; `account_id = ANY($1)`
/// also filters by the account list, so that a schema partitioned by account
/// reaches only those accounts' partitions (the batch class of
/// `tests/pg/partitioning.rs`).
pub(super) const LOCK_DUE_SQL: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM tollgate_leases l \
     JOIN unnest($1::text[], $2::text[]) AS u(account_id, lease_id) \
       ON l.account_id = u.account_id AND l.lease_id = u.lease_id \
     WHERE l.account_id = ANY($1) AND l.state = 'active' \
       AND (l.expiry_floor_us, l.expiry_submicro_ns) <= ($3, $4) \
     ORDER BY l.account_id, l.lease_id \
     FOR UPDATE OF l SKIP LOCKED"
);

/// The fleet's leases at the reclaim cutoff ($1, $2): how many are active, how
/// many of those are due, and the expiry of the most overdue one. Both parts
/// read active leases only, through the partial index
/// `tollgate_leases_active_expiry`, never the settled ones; a NULL cutoff
/// (the core's cutoff underflowed, so nothing is due) compares as unknown and
/// so matches no lease.
pub(super) const LEASE_SUMMARY_SQL: &str = "
SELECT s.active, s.due, o.expiry_floor_us, o.expiry_submicro_ns
FROM (
    SELECT count(*) AS active,
        count(*) FILTER (WHERE (l.expiry_floor_us, l.expiry_submicro_ns) <= ($1, $2)) AS due
    FROM tollgate_leases AS l
    WHERE l.state = 'active'
) AS s
LEFT JOIN (
    SELECT d.expiry_floor_us, d.expiry_submicro_ns
    FROM tollgate_leases AS d
    WHERE d.state = 'active' AND (d.expiry_floor_us, d.expiry_submicro_ns) <= ($1, $2)
    ORDER BY d.expiry_floor_us, d.expiry_submicro_ns
    LIMIT 1
) AS o ON true";

// -------------------------------------------------------------- credentials

/// The credential of the account $1 whose key hashes to $2.
pub(super) const CREDENTIAL_BY_KEY_SQL: &str = concat!(
    "SELECT ",
    credential_columns!(),
    " FROM tollgate_credentials c WHERE c.account_id = $1 AND c.key_hash = $2"
);

/// The account of a key issued before keys named their account, by its hash
/// ($1), from the directory migration 0020 filled.
pub(super) const LEGACY_KEY_ACCOUNT_SQL: &str =
    "SELECT k.account_id FROM tollgate_legacy_credential_keys k WHERE k.key_hash = $1";

/// The credential $2 of the account $1.
pub(super) const READ_CREDENTIAL_SQL: &str = concat!(
    "SELECT ",
    credential_columns!(),
    " FROM tollgate_credentials c WHERE c.account_id = $1 AND c.credential_id = $2"
);

pub(super) const LOCK_CREDENTIAL_SQL: &str = concat!(
    "SELECT ",
    credential_columns!(),
    " FROM tollgate_credentials c WHERE c.account_id = $1 AND c.credential_id = $2 FOR UPDATE"
);

/// Credentials among $1 that belong to the accounts $2, in `credential_id`
/// order: a usage batch's, under the accounts it has locked.
pub(super) const LOCK_CREDENTIALS_SQL: &str = concat!(
    "SELECT ",
    credential_columns!(),
    " FROM tollgate_credentials c WHERE c.credential_id = ANY($1) AND c.account_id = ANY($2) \
     ORDER BY c.credential_id FOR UPDATE"
);

/// Credentials among $1 of any account, unlocked: those a usage batch names
/// that none of its accounts holds, so that their events are rejected as
/// naming another account's credential rather than an unknown one.
pub(super) const READ_CREDENTIALS_ANY_ACCOUNT_SQL: &str =
    concat!("SELECT ", credential_columns!(), " FROM tollgate_credentials c WHERE c.credential_id = ANY($1)");

/// A new credential of an existing account ($2); nothing when there is none.
pub(super) const INSERT_CREDENTIAL_SQL: &str = "INSERT INTO tollgate_credentials (credential_id, account_id, label, key_hash, \
     created_floor_us, created_submicro_ns, accepted_events, accepted_units) \
     SELECT $1, a.account_id, $3, $4, $5, $6, 0, 0 \
     FROM tollgate_accounts a WHERE a.account_id = $2";

pub(super) const REVOKE_CREDENTIAL_SQL: &str = "UPDATE tollgate_credentials SET revoked_floor_us = $3, revoked_submicro_ns = $4 \
     WHERE account_id = $1 AND credential_id = $2";

// -------------------------------------------------------------------- usage

/// Request ids among $2 already accepted for the accounts $1.
pub(super) const RECORDED_EVENTS_SQL: &str = "SELECT u.account_id, u.request_id FROM tollgate_usage_events u \
     WHERE u.account_id = ANY($1) AND u.request_id = ANY($2)";

// ------------------------------------------------------------------- checks

/// One page of accounts after $1, at most $2, in `account_id` order.
pub(super) const CHECK_ACCOUNTS_SQL: &str = concat!(
    "SELECT ",
    account_columns!(),
    " FROM tollgate_accounts a WHERE a.account_id > $1 ORDER BY a.account_id LIMIT $2"
);

/// The active leases of the accounts $1: only `granted` and `used` enter the
/// equations.
pub(super) const CHECK_LEASES_SQL: &str = "SELECT l.lease_id, l.account_id, l.granted, l.used FROM tollgate_leases l \
     WHERE l.account_id = ANY($1) AND l.state = 'active'";

/// The hourly usage totals of the accounts $1 (migration 0025) that differ
/// from their events: each row's kept and counted units and events, a
/// missing side as zeros, in key order, at most $2. The events are summed
/// under the key the trigger that keeps the totals adds them under (the
/// migration's `tollgate_usage_hour` and `tollgate_dimensions_sha256`).
pub(super) const CHECK_USAGE_HOURLY_SQL: &str = "
WITH counted AS (
    SELECT u.account_id, tollgate_usage_hour(u.occurred_at_floor_us) AS hour, u.credential_id,
           u.lease_id IS NOT NULL AS leased,
           tollgate_dimensions_sha256(coalesce(u.dimensions, '{}')) AS dimensions_sha256,
           coalesce(u.dimensions, '{}') AS dimensions, sum(u.units) AS units, count(*) AS events
    FROM tollgate_usage_events u
    WHERE u.account_id = ANY($1)
    GROUP BY 1, 2, 3, 4, 5, 6
), kept AS (
    SELECT h.account_id, h.hour, h.credential_id, h.leased, h.dimensions_sha256, h.dimensions, h.units, h.events
    FROM tollgate_usage_hourly h
    WHERE h.account_id = ANY($1)
)
SELECT coalesce(k.account_id, c.account_id), coalesce(k.hour, c.hour),
       coalesce(k.credential_id, c.credential_id), coalesce(k.leased, c.leased),
       coalesce(k.dimensions, c.dimensions)::text,
       coalesce(k.units, 0)::text, coalesce(k.events, 0)::text,
       coalesce(c.units, 0)::text, coalesce(c.events, 0)::text
FROM kept k
FULL JOIN counted c
    ON c.account_id = k.account_id AND c.hour = k.hour AND c.credential_id = k.credential_id
   AND c.leased = k.leased AND c.dimensions_sha256 = k.dimensions_sha256
WHERE k.units IS DISTINCT FROM c.units OR k.events IS DISTINCT FROM c.events
ORDER BY 1, 2, 3, 4, 5
LIMIT $2";

/// Leases by state and by whether their expiry is an upper bound.
pub(super) const LEGACY_BOUNDS_SQL: &str = "SELECT state, expiry_is_upper_bound, count(*) FROM tollgate_leases \
     GROUP BY state, expiry_is_upper_bound";

pub(super) const CHECK_SNAPSHOT_SQL: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";

// ---------------------------------------------------------------- settings

pub(super) const APPLIED_MIGRATIONS_SQL: &str = "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version";

pub(super) const SHARED_CLOCK_SQL: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8";

pub(super) const REPLACE_SETTING_SQL: &str = "INSERT INTO tollgate_settings (key, value) VALUES ($1, $2) \
     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()";

/// Records a setting unless one is recorded, and returns the recorded value.
/// The CTE's insert is invisible to the outer SELECT of the same statement,
/// so at most one branch yields a row: the value this statement recorded, or
/// the one recorded before. Neither does when another server's insert was
/// uncommitted as the statement began: the insert waits for that commit and
/// then does nothing, while the SELECT's snapshot predates the commit.
/// Running the statement again takes a new snapshot, which sees that row.
/// (An upsert that always returns the row would also rewrite it on every
/// startup.)
pub(super) const PIN_SETTING_SQL: &str = "WITH inserted AS (
     INSERT INTO tollgate_settings (key, value) VALUES ($1, $2)
     ON CONFLICT (key) DO NOTHING
     RETURNING value
 )
 SELECT value FROM inserted
 UNION ALL
 SELECT s.value FROM tollgate_settings s WHERE s.key = $1";

// ------------------------------------------------------------- idempotency

/// Claims the key: inserts the row, or takes over an expired one. Returns a row
/// only when this transaction now owns the key; on conflict with a live record
/// the row is locked all the same (`ON CONFLICT DO UPDATE` locks the row before
/// it evaluates its `WHERE`).
pub(super) const CLAIM_KEY_SQL: &str = "INSERT INTO tollgate_idempotency_keys AS k (account_id, lookup_id, fingerprint, sealed_answer, \
     created_floor_us, created_submicro_ns, expires_floor_us, expires_submicro_ns) \
     VALUES ($1, $2, $3, '\\x', $4, $5, $6, $7) \
     ON CONFLICT (account_id, lookup_id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
     sealed_answer = EXCLUDED.sealed_answer, created_floor_us = EXCLUDED.created_floor_us, \
     created_submicro_ns = EXCLUDED.created_submicro_ns, expires_floor_us = EXCLUDED.expires_floor_us, \
     expires_submicro_ns = EXCLUDED.expires_submicro_ns \
     WHERE (k.expires_floor_us, k.expires_submicro_ns) <= ($4, $5) \
     RETURNING k.lookup_id";

/// The live record a claim found; read in a statement after the claim, so it
/// sees the row as committed by whoever held it.
pub(super) const RECORDED_KEY_SQL: &str = "SELECT k.fingerprint, k.sealed_answer FROM tollgate_idempotency_keys k \
     WHERE k.account_id = $1 AND k.lookup_id = $2";

pub(super) const RECORD_KEY_SQL: &str = "UPDATE tollgate_idempotency_keys SET sealed_answer = $3 \
     WHERE account_id = $1 AND lookup_id = $2";

pub(super) const PURGE_KEYS_SQL: &str = "DELETE FROM tollgate_idempotency_keys k USING ( \
     SELECT e.account_id, e.lookup_id FROM tollgate_idempotency_keys e \
     WHERE (e.expires_floor_us, e.expires_submicro_ns) <= ($1, $2) \
     ORDER BY e.expires_floor_us, e.expires_submicro_ns LIMIT $3 FOR UPDATE SKIP LOCKED) d \
     WHERE k.account_id = d.account_id AND k.lookup_id = d.lookup_id";

// `journal_columns!` is also the outbox's, which reads entries to derive them.
#[macro_use]
mod journal;
pub(super) use journal::{
    ACQUIRE_IF_UNCHANGED_SQL, CHECK_JOURNAL_SQL, CREDIT_SQL, PERSIST_SQL, READ_JOURNAL_SQL, RECLAIM_DUE_SQL,
    RELEASE_GUESSED_IF_UNCHANGED_SQL, RELEASE_READ_IF_UNCHANGED_SQL, SETTLE_IF_UNCHANGED_SQL,
};

#[cfg(test)]
mod tests;

mod listings;
pub(super) use listings::{LIST_ACCOUNTS_SQL, LIST_CREDENTIALS_SQL, LIST_CREDITS_SQL, LIST_LEASES_SQL};

mod usage_queries;
pub(super) use usage_queries::{
    CUSTOM_PLANS_SQL, USAGE_EVENTS_AFTER_SQL, USAGE_EVENTS_FIRST_SQL, USAGE_HOURS_SQL, USAGE_TOTALS_SQL,
};

mod outbox;
pub(super) use outbox::{
    CLAIM_DELIVERIES_SQL, DELETE_ENDPOINT_DELIVERIES_SQL, DELETE_ENDPOINT_SQL, DERIVE_PENDING_SQL, ENDPOINTS_LOCK_SQL,
    FINISH_DELIVERY_SQL, INSERT_ENDPOINT_SQL, INSERT_RULE_SQL, LIST_DELIVERIES_SQL, LOCK_ACCOUNT_SEQ_SQL,
    LOCK_DERIVE_RULES_SQL, LOCK_REFUSAL_RULES_SQL, OUTBOX_COUNTS_SQL, PURGE_RETIRED_RULES_SQL, READ_ENDPOINT_SQL,
    READ_ENDPOINTS_SQL, READ_RULES_SQL, REDELIVER_SQL, REFUSAL_ACCOUNT_SQL, RETIRE_RULE_SQL, ROTATE_SECRET_SQL,
    SHARE_ENDPOINTS_SQL, STORE_DERIVED_SQL, TRY_DERIVE_LOCK_SQL,
};
