//! The outbox's statements: alert rules, webhook endpoints, deriving events
//! from the journal, and deliveries (`store/outbox/`). Instants are
//! `(floor_us, submicro_ns)` pairs; counters follow `COUNTER_NAMES`.
//!
//! Rules and cursors are per account, and every statement of one account
//! names it by equality. Endpoints are global (a reference table), and so is
//! what goes by endpoint or by delivery id: an endpoint's deliveries, the
//! worker's claims and their results span accounts by design
//! (`tests/pg/partitioning.rs` gives each its reason).

/// An alert rule's columns, as `RuleRow` reads them.
macro_rules! rule_columns {
    () => {
        "r.account_id, r.rule_id, r.kind, r.threshold, r.created_floor_us, r.created_submicro_ns, \
         r.from_seq, r.refused_at_seq, r.deleted_seq"
    };
}

/// An endpoint's columns but its secrets, as `EndpointRow` reads them.
macro_rules! endpoint_columns {
    () => {
        "w.endpoint_id, w.url, w.event_types, w.created_floor_us, w.created_submicro_ns, \
         w.rotated_floor_us, w.rotated_submicro_ns, w.previous_secret_until_floor_us, \
         w.previous_secret_until_submicro_ns"
    };
}

/// A delivery's columns, as `DeliveryRow` reads them.
macro_rules! delivery_columns {
    () => {
        "d.account_id, d.delivery_id, d.endpoint_id, d.event_id, d.event_type, d.state, d.attempts, \
         d.next_attempt_floor_us, d.next_attempt_submicro_ns, d.last_error, d.last_status, \
         d.created_floor_us, d.created_submicro_ns, d.delivered_floor_us, d.delivered_submicro_ns"
    };
}

// -------------------------------------------------------------------- locks

/// The deriver's lock (key: "tgderive" in ASCII), held to the end of the
/// transaction, if no other server holds it: one server derives at a time,
/// and the others skip their turn rather than wait.
pub(in crate::store) const TRY_DERIVE_LOCK_SQL: &str = "SELECT pg_try_advisory_xact_lock(8387783217874826853)";

/// The lock creating an endpoint waits for (key: "tghooks!" in ASCII), held
/// to the end of the transaction, so that servers creating endpoints at once
/// count them one after another.
pub(in crate::store) const ENDPOINTS_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(8387787658820809505)";

// -------------------------------------------------------------------- rules

/// The account $1's journal sequence number, locking the account: no entry
/// is journaled until the transaction ends, so a rule created in it judges
/// exactly the entries after this number.
pub(in crate::store) const LOCK_ACCOUNT_SEQ_SQL: &str =
    "SELECT a.journal_seq FROM tollgate_accounts a WHERE a.account_id = $1 FOR NO KEY UPDATE";

/// A rule of the account $1 (id $2, kind $3, threshold $4, created at $5,
/// $6, from $7), numbered after the account's other rules, unless the
/// account already holds $8 rules (deleted ones no longer count): then
/// nothing. Runs under the account's lock, so rule creations of one account
/// count one after another.
pub(in crate::store) const INSERT_RULE_SQL: &str = "INSERT INTO tollgate_alert_rules (account_id, rule_id, kind, threshold, \
     created_floor_us, created_submicro_ns, from_seq, refused_at_seq, ordinal) \
     SELECT $1, $2, $3, $4, $5, $6, $7, NULL, coalesce(max(r.ordinal), 0) + 1 \
     FROM tollgate_alert_rules r WHERE r.account_id = $1 \
     HAVING count(*) FILTER (WHERE r.deleted_seq IS NULL) < $8 \
     RETURNING rule_id";

/// The rules of the account $1, oldest first, but the deleted ones.
pub(in crate::store) const READ_RULES_SQL: &str = concat!(
    "SELECT ",
    rule_columns!(),
    " FROM tollgate_alert_rules r WHERE r.account_id = $1 AND r.deleted_seq IS NULL ORDER BY r.ordinal"
);

/// Deletes the rule $2 of the account $1 as of the account's current
/// journal entry: it still judges the entries up to it, which the deriver
/// may not have reached. Nothing when there is no such rule, or it is
/// deleted already.
pub(in crate::store) const RETIRE_RULE_SQL: &str = "UPDATE tollgate_alert_rules AS r SET deleted_seq = a.journal_seq \
     FROM tollgate_accounts AS a \
     WHERE r.account_id = $1 AND r.rule_id = $2 AND r.deleted_seq IS NULL AND a.account_id = $1 \
     RETURNING r.rule_id";

/// Removes the deleted rules of the account $1 that judge no entry left to
/// derive: those deleted at or before its cursor (0 without one). The
/// deriver removes the others as its cursor passes them.
pub(in crate::store) const PURGE_RETIRED_RULES_SQL: &str = "DELETE FROM tollgate_alert_rules AS r \
     WHERE r.account_id = $1 AND r.deleted_seq <= coalesce( \
         (SELECT c.seq FROM tollgate_outbox_cursors c WHERE c.account_id = $1), 0)";

/// The `acquire_refused` rules of the account $1 but the deleted ones,
/// locked, oldest first.
pub(in crate::store) const LOCK_REFUSAL_RULES_SQL: &str = concat!(
    "SELECT ",
    rule_columns!(),
    " FROM tollgate_alert_rules r \
     WHERE r.account_id = $1 AND r.kind = 'acquire_refused' AND r.deleted_seq IS NULL \
     ORDER BY r.ordinal FOR UPDATE"
);

/// The account $1 at a refusal: its counters, its journal sequence number,
/// and the ids of its fired `acquire_refused` rules that a journal entry
/// after their refusal re-arms (`tollgate_core::alerts::rearms`: a later
/// entry that raises `available`), which the deriver may not have reached
/// yet. Runs after `LOCK_REFUSAL_RULES_SQL`, so it sees the rules as their
/// last writer left them, and reads the account and its journal in one
/// snapshot.
pub(in crate::store) const REFUSAL_ACCOUNT_SQL: &str = concat!(
    "SELECT ",
    account_columns!(),
    ", a.journal_seq, ARRAY( \
         SELECT r.rule_id FROM tollgate_alert_rules r \
         WHERE r.account_id = $1 AND r.kind = 'acquire_refused' AND r.deleted_seq IS NULL \
           AND EXISTS (SELECT FROM tollgate_journal j \
                       WHERE j.account_id = $1 AND j.seq > r.refused_at_seq AND j.available > 0) \
     ) AS rearmed \
     FROM tollgate_accounts a WHERE a.account_id = $1"
);

/// The rules of the accounts $1, deleted ones included, locked in account
/// order, each account's oldest first: the rules a derivation judges entries
/// by and re-arms.
pub(in crate::store) const LOCK_DERIVE_RULES_SQL: &str = concat!(
    "SELECT ",
    rule_columns!(),
    " FROM tollgate_alert_rules r WHERE r.account_id = ANY($1) ORDER BY r.account_id, r.ordinal FOR UPDATE"
);

// ---------------------------------------------------------------- endpoints

/// An endpoint (id $1, url $2, event types $3, sealed secret $4, created at
/// $5, $6), numbered after the others, unless $7 exist: then nothing. Runs
/// under `ENDPOINTS_LOCK_SQL`.
pub(in crate::store) const INSERT_ENDPOINT_SQL: &str = "INSERT INTO tollgate_webhook_endpoints (endpoint_id, url, event_types, secret, \
     created_floor_us, created_submicro_ns, ordinal) \
     SELECT $1, $2, $3, $4, $5, $6, coalesce(max(w.ordinal), 0) + 1 \
     FROM tollgate_webhook_endpoints w \
     HAVING count(*) < $7 \
     RETURNING endpoint_id";

/// Every endpoint, oldest first.
pub(in crate::store) const READ_ENDPOINTS_SQL: &str =
    concat!("SELECT ", endpoint_columns!(), " FROM tollgate_webhook_endpoints w ORDER BY w.ordinal");

/// Whether the endpoint $1 exists.
pub(in crate::store) const READ_ENDPOINT_SQL: &str =
    "SELECT w.endpoint_id FROM tollgate_webhook_endpoints w WHERE w.endpoint_id = $1";

/// Every endpoint's id, event types and creation, oldest first,
/// share-locked: an endpoint being deleted is waited for and then not seen,
/// and one seen is not deleted until the deliveries made for it are
/// committed, so the deletion removes them too.
pub(in crate::store) const SHARE_ENDPOINTS_SQL: &str = "SELECT w.endpoint_id, w.event_types, w.created_floor_us, \
     w.created_submicro_ns FROM tollgate_webhook_endpoints w ORDER BY w.ordinal FOR SHARE";

pub(in crate::store) const DELETE_ENDPOINT_SQL: &str = "DELETE FROM tollgate_webhook_endpoints WHERE endpoint_id = $1";

/// The deliveries of the endpoint $1, of every account; run after
/// `DELETE_ENDPOINT_SQL`, which waited for every transaction that made one.
pub(in crate::store) const DELETE_ENDPOINT_DELIVERIES_SQL: &str =
    "DELETE FROM tollgate_webhook_deliveries WHERE endpoint_id = $1";

/// Replaces the endpoint $1's secret with $2; the one it replaces signs
/// until ($3, $4). Rotated at ($5, $6).
pub(in crate::store) const ROTATE_SECRET_SQL: &str = concat!(
    "UPDATE tollgate_webhook_endpoints AS w SET previous_secret = w.secret, secret = $2, \
     previous_secret_until_floor_us = $3, previous_secret_until_submicro_ns = $4, \
     rotated_floor_us = $5, rotated_submicro_ns = $6 \
     WHERE w.endpoint_id = $1 RETURNING ",
    endpoint_columns!()
);

// ------------------------------------------------------------------ deriving

/// In one snapshot, the journal entries not yet derived, at most $1, in
/// account and then sequence order: the accounts whose `journal_seq` is
/// past their cursor's (0 without one), from the account $2 on ('' for all)
/// but those in $3 (the accounts the pass skipped), each with its
/// cursor (NULL without one) and the counters it holds, in `COUNTER_NAMES`
/// order, then the entries after the cursor up to the `journal_seq` read.
/// Each row also names its account apart from the entry's columns, so that
/// an entry that does not decode still names the account to skip. An entry
/// is inserted by the statement that increments `journal_seq`, so every
/// entry up to it is in the snapshot.
pub(in crate::store) const DERIVE_PENDING_SQL: &str = concat!(
    "
WITH due AS (
    SELECT a.account_id AS due_account_id, a.journal_seq AS due_journal_seq, c.seq AS cursor_seq,
        CASE WHEN c.account_id IS NOT NULL THEN ARRAY[",
    counters!("c."),
    "] END AS cursor_counters
    FROM tollgate_accounts AS a
    LEFT JOIN tollgate_outbox_cursors AS c ON c.account_id = a.account_id
    WHERE a.journal_seq > coalesce(c.seq, 0) AND a.account_id >= $2 AND a.account_id <> ALL($3::text[])
    ORDER BY a.account_id
    LIMIT $1
)
SELECT d.due_account_id, d.cursor_seq, d.cursor_counters, ",
    journal_columns!(),
    "
FROM due AS d
CROSS JOIN LATERAL (
    SELECT ",
    journal_columns!(),
    "
    FROM tollgate_journal
    WHERE account_id = d.due_account_id AND seq > coalesce(d.cursor_seq, 0) AND seq <= d.due_journal_seq
    ORDER BY seq
    LIMIT $1
) AS j
ORDER BY d.due_account_id, j.seq
LIMIT $1"
);

/// Stores what a derivation or a refusal decided, in one statement: the
/// events (account $1, id $2, type $3, body $4, at $5, $6), their pending
/// deliveries (account $7, id $8, endpoint $9, event $10, type $11, due and
/// created at $12, $13), the accounts' cursors (account $14, sequence number
/// $15, counters $16 to $22 in `COUNTER_NAMES` order), the rules whose
/// `refused_at_seq` changed (account $23, rule $24, value $25) and the
/// deleted rules the cursors passed (account $26, rule $27; none of them
/// among the changed). An event or delivery stored already is left as it
/// is. Every row is found or routed by its account.
pub(in crate::store) const STORE_DERIVED_SQL: &str = "
WITH events AS (
    INSERT INTO tollgate_webhook_events (account_id, event_id, event_type, body, created_floor_us,
        created_submicro_ns)
    SELECT u.account_id, u.event_id, u.event_type, u.body, u.floor_us, u.submicro_ns
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int2[])
        AS u(account_id, event_id, event_type, body, floor_us, submicro_ns)
    ON CONFLICT (account_id, event_id) DO NOTHING
    RETURNING 1
), deliveries AS (
    INSERT INTO tollgate_webhook_deliveries (account_id, delivery_id, endpoint_id, event_id, event_type,
        state, attempts, next_attempt_floor_us, next_attempt_submicro_ns, created_floor_us,
        created_submicro_ns)
    SELECT u.account_id, u.delivery_id, u.endpoint_id, u.event_id, u.event_type, 'pending', 0,
        u.floor_us, u.submicro_ns, u.floor_us, u.submicro_ns
    FROM unnest($7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::int8[], $13::int2[])
        AS u(account_id, delivery_id, endpoint_id, event_id, event_type, floor_us, submicro_ns)
    ON CONFLICT (account_id, event_id, endpoint_id) DO NOTHING
    RETURNING 1
), cursors AS (
    INSERT INTO tollgate_outbox_cursors (account_id, seq, credited, available, reserved, consumed, overage,
        billed, next_fence)
    SELECT u.account_id, u.seq, u.credited, u.available, u.reserved, u.consumed, u.overage, u.billed,
        u.next_fence
    FROM unnest($14::text[], $15::int8[], $16::int8[], $17::int8[], $18::int8[], $19::int8[], $20::int8[],
                $21::int8[], $22::int8[])
        AS u(account_id, seq, credited, available, reserved, consumed, overage, billed, next_fence)
    ON CONFLICT (account_id) DO UPDATE SET seq = EXCLUDED.seq, credited = EXCLUDED.credited,
        available = EXCLUDED.available, reserved = EXCLUDED.reserved, consumed = EXCLUDED.consumed,
        overage = EXCLUDED.overage, billed = EXCLUDED.billed, next_fence = EXCLUDED.next_fence
    RETURNING 1
), rules AS (
    UPDATE tollgate_alert_rules AS r SET refused_at_seq = u.refused_at_seq
    FROM unnest($23::text[], $24::text[], $25::int8[]) AS u(account_id, rule_id, refused_at_seq)
    WHERE r.account_id = u.account_id AND r.rule_id = u.rule_id
    RETURNING 1
), purged AS (
    DELETE FROM tollgate_alert_rules AS p
    USING unnest($26::text[], $27::text[]) AS u(account_id, rule_id)
    WHERE p.account_id = u.account_id AND p.rule_id = u.rule_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM events) AS events, (SELECT count(*) FROM deliveries) AS deliveries,
    (SELECT count(*) FROM cursors) AS cursors, (SELECT count(*) FROM rules) AS rules,
    (SELECT count(*) FROM purged) AS purged";

// --------------------------------------------------------------- deliveries

/// Claims, skipping those another server is claiming and those of the
/// endpoints $6, up to $3 pending deliveries due at ($1, $2), in due order:
/// each one's attempt is numbered
/// and it is due again at ($4, $5), when the claim lapses. Returns each with
/// its endpoint's URL and secrets (the previous one only while it still
/// signs at ($1, $2)) and its event's body, in the order claimed. A
/// delivery another server claimed and committed since this statement's
/// snapshot is re-checked when locked, and is no longer due.
pub(in crate::store) const CLAIM_DELIVERIES_SQL: &str = "
WITH due AS (
    SELECT d.account_id, d.delivery_id, d.next_attempt_floor_us AS due_floor_us,
        d.next_attempt_submicro_ns AS due_submicro_ns
    FROM tollgate_webhook_deliveries AS d
    WHERE d.state = 'pending' AND (d.next_attempt_floor_us, d.next_attempt_submicro_ns) <= ($1, $2)
      AND d.endpoint_id <> ALL($6::text[])
    ORDER BY d.next_attempt_floor_us, d.next_attempt_submicro_ns, d.delivery_id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE tollgate_webhook_deliveries AS d
    SET attempts = d.attempts + 1, next_attempt_floor_us = $4, next_attempt_submicro_ns = $5
    FROM due
    WHERE d.account_id = due.account_id AND d.delivery_id = due.delivery_id
    RETURNING d.account_id, d.delivery_id, d.endpoint_id, d.event_id, d.attempts, d.created_floor_us,
        d.created_submicro_ns, due.due_floor_us, due.due_submicro_ns
)
SELECT c.delivery_id, c.endpoint_id, c.event_id, c.attempts, c.created_floor_us, c.created_submicro_ns,
    w.url, w.secret,
    CASE WHEN (w.previous_secret_until_floor_us, w.previous_secret_until_submicro_ns) > ($1, $2)
         THEN w.previous_secret END AS previous_secret,
    e.body
FROM claimed AS c
JOIN tollgate_webhook_endpoints AS w ON w.endpoint_id = c.endpoint_id
JOIN tollgate_webhook_events AS e ON e.account_id = c.account_id AND e.event_id = c.event_id
ORDER BY c.due_floor_us, c.due_submicro_ns, c.delivery_id";

/// Records the result of attempt $2 of the delivery $1, only while that
/// attempt is its latest and it is pending: state $3, next attempt ($4, $5),
/// last error $6 and status $7, delivered at ($8, $9).
pub(in crate::store) const FINISH_DELIVERY_SQL: &str = "UPDATE tollgate_webhook_deliveries SET state = $3, \
     next_attempt_floor_us = $4, next_attempt_submicro_ns = $5, last_error = $6, last_status = $7, \
     delivered_floor_us = $8, delivered_submicro_ns = $9 \
     WHERE delivery_id = $1 AND attempts = $2 AND state = 'pending'";

/// The deliveries of the endpoint $1 after the delivery id $2, at most $3,
/// in delivery id order (the listings' rules, `sql/listings.rs`).
pub(in crate::store) const LIST_DELIVERIES_SQL: &str = concat!(
    "SELECT ",
    delivery_columns!(),
    " FROM tollgate_webhook_deliveries d WHERE d.endpoint_id = $1 AND d.delivery_id > $2 \
     ORDER BY d.delivery_id LIMIT $3"
);

/// Makes the delivery $2 of the endpoint $1 pending and due at ($3, $4);
/// its attempts keep counting.
pub(in crate::store) const REDELIVER_SQL: &str = concat!(
    "UPDATE tollgate_webhook_deliveries AS d SET state = 'pending', next_attempt_floor_us = $3, \
     next_attempt_submicro_ns = $4, delivered_floor_us = NULL, delivered_submicro_ns = NULL \
     WHERE d.endpoint_id = $1 AND d.delivery_id = $2 RETURNING ",
    delivery_columns!()
);

/// Deliveries by state.
pub(in crate::store) const OUTBOX_COUNTS_SQL: &str =
    "SELECT d.state, count(*) AS deliveries FROM tollgate_webhook_deliveries d GROUP BY d.state";
