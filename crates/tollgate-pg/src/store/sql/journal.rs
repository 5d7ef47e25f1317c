//! The statements that change an account's counters. Each also increments
//! the account's `journal_seq` and inserts the journal entry numbered by it
//! from the update's `RETURNING`, in the same statement, so an entry exists
//! exactly when its change committed and no operation spends a round trip on
//! it (`tollgate_core::journal`). Deltas are bound as the core computed them,
//! counters in `COUNTER_NAMES` order; an instant is `(floor_us, submicro_ns)`.

/// The columns of a journal entry, in the order every insert lists them.
macro_rules! journal_columns {
    () => {
        concat!(
            "account_id, seq, kind, ",
            counters!(""),
            ", credit_id, lease_id, leases, events, at_floor_us, at_submicro_ns"
        )
    };
}

// ----------------------------------------------------------------- accounts

/// Records a credit: the account's new `credited` and `available` ($3, $4),
/// the credit ($2, $5), and its journal entry (deltas $6, at $7, $8).
pub(in crate::store) const CREDIT_SQL: &str = concat!(
    "
WITH credited AS (
    UPDATE tollgate_accounts AS a SET credited = $3, available = $4, journal_seq = a.journal_seq + 1
    WHERE a.account_id = $1
    RETURNING a.account_id, a.journal_seq
), recorded AS (
    INSERT INTO tollgate_credits (account_id, credit_id, units)
    SELECT credited.account_id, $2, $5 FROM credited
    RETURNING 1
)
INSERT INTO tollgate_journal (",
    journal_columns!(),
    ")
SELECT c.account_id, c.journal_seq, 'credit', ",
    elements!("$6"),
    ", $2, NULL, '{}', NULL, $7, $8
FROM credited AS c"
);

// ------------------------------------------------------------------ persist

/// The one write statement of the locking path. Each data-modifying CTE
/// consumes parallel arrays, one per column (empty ones are no-ops), so every
/// operation persists in one round trip, and the counts returned prove every
/// intended row was written. The journal's entries (kind $37, one per
/// account of $38, each with its deltas, ids and the leases of $49/$50 that
/// name its account, at $51, $52) take the sequence numbers the account
/// update gives the accounts that have one. Every row is found by its
/// account and its key (the leases' and credentials' accounts are $35 and
/// $36), so each write stays within the accounts it names.
pub(in crate::store) const PERSIST_SQL: &str = concat!(
    "
WITH accounts AS (
    UPDATE tollgate_accounts AS a
    SET credited = u.credited, available = u.available, reserved = u.reserved,
        consumed = u.consumed, overage = u.overage, billed = u.billed,
        next_fence = u.next_fence,
        journal_seq = a.journal_seq + (u.account_id = ANY($38))::int4
    FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
                $7::int8[], $8::int8[])
        AS u(account_id, credited, available, reserved, consumed, overage, billed, next_fence)
    WHERE a.account_id = u.account_id
    RETURNING a.account_id, a.journal_seq
), leases AS (
    UPDATE tollgate_leases AS l
    SET used = u.used, state = u.state,
        settled_at = CASE WHEN u.state = 'active' THEN NULL ELSE coalesce(l.settled_at, now()) END
    FROM unnest($35::text[], $9::text[], $10::int8[], $11::text[]) AS u(account_id, lease_id, used, state)
    WHERE l.account_id = u.account_id AND l.lease_id = u.lease_id
    RETURNING 1
), granted AS (
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted,
        used, state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    SELECT u.lease_id, u.account_id, u.fencing_token, u.capability_hash, u.granted,
        u.used, u.state, u.expiry_floor_us, u.expiry_submicro_ns, u.expiry_is_upper_bound
    FROM unnest($12::text[], $13::text[], $14::int8[], $15::bytea[], $16::int8[], $17::int8[],
                $18::text[], $19::int8[], $20::int2[], $21::bool[])
        AS u(lease_id, account_id, fencing_token, capability_hash, granted, used, state,
             expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    RETURNING 1
), credentials AS (
    UPDATE tollgate_credentials AS c
    SET accepted_events = u.accepted_events, accepted_units = u.accepted_units,
        last_used_floor_us = u.last_used_floor_us, last_used_submicro_ns = u.last_used_submicro_ns
    FROM unnest($36::text[], $22::text[], $23::int8[], $24::int8[], $25::int8[], $26::int2[])
        AS u(account_id, credential_id, accepted_events, accepted_units, last_used_floor_us,
             last_used_submicro_ns)
    WHERE c.account_id = u.account_id AND c.credential_id = u.credential_id
    RETURNING 1
), events AS (
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
        occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token, dimensions)
    SELECT u.account_id, u.request_id, u.credential_id, u.units, u.occurred_at_floor_us,
        u.occurred_at_submicro_ns, u.lease_id, u.fencing_token, u.dimensions::jsonb
    FROM unnest($27::text[], $28::text[], $29::text[], $30::int8[], $31::int8[], $32::int2[],
                $33::text[], $34::int8[], $53::text[])
        AS u(account_id, request_id, credential_id, units, occurred_at_floor_us,
             occurred_at_submicro_ns, lease_id, fencing_token, dimensions)
    RETURNING 1
), named AS (
    SELECT x.account_id, array_agg(x.lease_id ORDER BY x.n) AS leases
    FROM unnest($49::text[], $50::text[]) WITH ORDINALITY AS x(account_id, lease_id, n)
    GROUP BY x.account_id
), journal AS (
    INSERT INTO tollgate_journal (",
    journal_columns!(),
    ")
    SELECT w.account_id, w.journal_seq, $37, ",
    counters!("j."),
    ", j.credit_id, j.lease_id, coalesce(named.leases, '{}'), j.events, $51, $52
    FROM unnest($38::text[], $39::int8[], $40::int8[], $41::int8[], $42::int8[], $43::int8[],
                $44::int8[], $45::int8[], $46::text[], $47::text[], $48::int8[])
        AS j(account_id, ",
    counters!(""),
    ", credit_id, lease_id, events)
    JOIN accounts AS w ON w.account_id = j.account_id
    LEFT JOIN named ON named.account_id = j.account_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM leases),
       (SELECT count(*) FROM granted), (SELECT count(*) FROM credentials),
       (SELECT count(*) FROM events), (SELECT count(*) FROM journal)"
);

// ----------------------------------------------------------- unlocked path

/// Stores the account's new counters ($3) and inserts the granted lease
/// ($4–$12), only if every counter still holds what the core decided on
/// ($2), with its journal entry (deltas $13, at $14, $15). Returns whether
/// it wrote, and the account as the statement found it (its snapshot, from
/// before the write), for deciding again when it did not.
pub(in crate::store) const ACQUIRE_IF_UNCHANGED_SQL: &str = concat!(
    "
WITH account AS (
    UPDATE tollgate_accounts AS a
    SET ",
    assign_elements!("$3"),
    ", journal_seq = a.journal_seq + 1
    WHERE a.account_id = $1
      AND (",
    counters!("a."),
    ")
          = (",
    elements!("$2"),
    ")
    RETURNING a.account_id, a.journal_seq
), granted AS (
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted,
        used, state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    SELECT $4, account.account_id, $5, $6, $7, $8, $9, $10, $11, $12
    FROM account
    RETURNING 1
), journal AS (
    INSERT INTO tollgate_journal (",
    journal_columns!(),
    ")
    SELECT account.account_id, account.journal_seq, 'acquire', ",
    elements!("$13"),
    ", NULL, $4, '{}', NULL, $14, $15
    FROM account
    RETURNING 1
)
SELECT (SELECT count(*) FROM granted) AS written, ",
    account_columns!(),
    " FROM tollgate_accounts a WHERE a.account_id = $1"
);

/// The release write, for an account condition: settles the lease $2 of the
/// account $1 if every column of its row still holds what the core decided
/// on ($1–$3, $6–$11; `state` must be active), under its account's lock
/// taken without waiting,
/// and adds the lease's account change ($5, counters in `COUNTER_NAMES`
/// order) to the account, journaled as its next entry at ($12, $13).
/// Returns whether it wrote, the account's counters as
/// written (the change is added to whatever the row held by then, which may
/// differ from the view), and the lease and account as the statement found
/// them (its snapshot).
macro_rules! release_if_unchanged {
    ($account_condition:expr) => {
        concat!(
            "
WITH locked AS (
    SELECT a.account_id
    FROM tollgate_accounts AS a
    WHERE a.account_id = $1",
            $account_condition,
            "
    FOR NO KEY UPDATE SKIP LOCKED
), settled AS (
    UPDATE tollgate_leases AS l
    SET state = $4, settled_at = now()
    FROM locked
    WHERE l.account_id = $1
      AND l.lease_id = $2
      AND l.account_id = locked.account_id
      AND l.state = 'active'
      AND l.used = $3
      AND (l.fencing_token, l.capability_hash, l.granted, l.expiry_floor_us, l.expiry_submicro_ns,
           l.expiry_is_upper_bound) = ($6, $7, $8, $9, $10, $11)
    RETURNING l.account_id
), accounts AS (
    UPDATE tollgate_accounts AS a
    SET ",
            add_elements!("$5"),
            ", journal_seq = a.journal_seq + 1
    FROM settled
    WHERE a.account_id = $1 AND a.account_id = settled.account_id
    RETURNING a.account_id, a.journal_seq, ",
            counters!("a."),
            "
), journal AS (
    INSERT INTO tollgate_journal (",
            journal_columns!(),
            ")
    SELECT w.account_id, w.journal_seq, 'release', ",
            elements!("$5"),
            ", NULL, $2, '{}', NULL, $12, $13
    FROM accounts AS w
    RETURNING 1
)
SELECT (SELECT count(*) FROM accounts) AS written, w.credited AS written_credited,
    w.available AS written_available, w.reserved AS written_reserved,
    w.consumed AS written_consumed, w.overage AS written_overage, w.billed AS written_billed,
    w.next_fence AS written_next_fence, ",
            account_columns!(),
            ", ",
            lease_columns!(),
            " FROM tollgate_leases l JOIN tollgate_accounts a ON a.account_id = l.account_id \
     LEFT JOIN accounts w ON true WHERE l.account_id = $1 AND l.lease_id = $2"
        )
    };
}

/// The release write for a view read from the rows: the core decided on a
/// decoded row, and the change is added to whatever the account holds.
pub(in crate::store) const RELEASE_READ_IF_UNCHANGED_SQL: &str = release_if_unchanged!("");

/// The release write for a remembered view, which was never decoded from the
/// row: the account's counters must also still be those of the view ($14),
/// so that only a row equal to it in every column is written.
pub(in crate::store) const RELEASE_GUESSED_IF_UNCHANGED_SQL: &str =
    release_if_unchanged!(concat!("\n      AND (", counters!("a."), ")\n          = (", elements!("$14"), ")"));

/// Settles every listed lease that is still active with the `used` the core
/// read, whose account it can lock without waiting, and adds each settled
/// lease's account change ($5–$11, one array per counter in `COUNTER_NAMES`
/// order) to its account. Returns the settled lease ids. Each account the
/// pass settled leases in gets one journal entry, at ($12, $13), whose deltas
/// are the sum of its leases' changes.
///
/// It locks each listed account once, in `account_id` order and without
/// waiting (`locked`), and then updates the leases of the accounts it holds
/// without locking them first, as the release write does. No cycle of waits
/// can form: every other writer of a lease holds the lease's account first,
/// and this statement holds those accounts, so the only transaction that can
/// hold one of their leases is a locking reclaim pass, which never waits
/// (`LOCK_DUE_SQL`, `store/mod.rs`).
pub(in crate::store) const SETTLE_IF_UNCHANGED_SQL: &str = concat!(
    "
WITH listed AS (
    SELECT u.*
    FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::int8[], $6::int8[], $7::int8[],
                $8::int8[], $9::int8[], $10::int8[], $11::int8[])
        AS u(account_id, lease_id, used, state, ",
    counters!(""),
    ")
), locked AS (
    SELECT a.account_id
    FROM tollgate_accounts AS a
    WHERE a.account_id = ANY($1)
    ORDER BY a.account_id
    FOR NO KEY UPDATE OF a SKIP LOCKED
), settled AS (
    UPDATE tollgate_leases AS l
    SET state = k.state, settled_at = now()
    FROM listed AS k
    JOIN locked AS x ON x.account_id = k.account_id
    WHERE l.lease_id = k.lease_id
      AND l.account_id = k.account_id
      AND l.state = 'active'
      AND l.used = k.used
    RETURNING l.lease_id, l.account_id, ",
    counters!("k."),
    "
), totals AS (
    SELECT s.account_id, sum(s.credited) AS credited, sum(s.available) AS available,
        sum(s.reserved) AS reserved, sum(s.consumed) AS consumed, sum(s.overage) AS overage,
        sum(s.billed) AS billed, sum(s.next_fence) AS next_fence,
        array_agg(s.lease_id ORDER BY s.lease_id) AS leases
    FROM settled AS s
    GROUP BY s.account_id
), accounts AS (
    UPDATE tollgate_accounts AS a
    SET credited = a.credited + t.credited, available = a.available + t.available,
        reserved = a.reserved + t.reserved, consumed = a.consumed + t.consumed,
        overage = a.overage + t.overage, billed = a.billed + t.billed,
        next_fence = a.next_fence + t.next_fence, journal_seq = a.journal_seq + 1
    FROM totals AS t
    WHERE a.account_id = t.account_id
    RETURNING a.account_id, a.journal_seq
), journal AS (
    INSERT INTO tollgate_journal (",
    journal_columns!(),
    ")
    SELECT w.account_id, w.journal_seq, 'reclaim', ",
    counters!("t."),
    ", NULL, NULL, t.leases, NULL, $12, $13
    FROM accounts AS w JOIN totals AS t ON t.account_id = w.account_id
    RETURNING 1
)
SELECT s.lease_id FROM settled AS s"
);

/// One reclaim pass in one statement, for a pass whose rows all decode: it
/// chooses the due leases as `READ_DUE_SQL` does (cutoff $1, $2; at most $3;
/// accounts from the $4 most overdue), locks their accounts in `account_id`
/// order without waiting, and, if every lease it chose and every account it
/// locked decodes (`lease_decodes!`, `account_decodes!`; $10, $11 bound to
/// the core's `FLOOR_US_MIN`, `FLOOR_US_MAX`), settles the leases of the
/// accounts it holds that are still active and due, adds each account's
/// change and writes its `reclaim` journal entry at ($5, $6). Otherwise it
/// writes nothing, and the pass reads and decides in the client (`decodes`
/// is false).
///
/// The change is the core's `SETTLEMENT_TERMS` ($7, $8, $9: the `granted`,
/// `used` and `least` arrays, in `COUNTER_NAMES` order), evaluated over the
/// sums of each account's settled leases: each counter moves one way for
/// every lease, so the sum is in range exactly when each lease's step would
/// be, and a counter that would leave `BIGINT` or go negative fails the
/// statement as a whole (nothing is written; the pass then runs in the
/// client, where the core names the lease). A lease is settled with the
/// `granted` and `used` of the row version it updates, which are returned
/// for the report. The lock argument is `SETTLE_IF_UNCHANGED_SQL`'s.
///
/// Returns one row per account it settled leases of, in account order, with
/// their ids, `granted` and `used` (three lists in one order, that of the
/// aggregate's input), each row with how many
/// leases were considered and read (`considered`, `due`) and the verdict;
/// one row of NULL accounts when none was settled.
pub(in crate::store) const RECLAIM_DUE_SQL: &str = concat!(
    "
WITH ",
    reclaim_heads!(),
    ", due AS (
    SELECT l.row_table, l.row_id, l.account_id, ",
    lease_decodes!("l.", "$10", "$11"),
    " AS decodes
    FROM ",
    heads_due_leases!("d.tableoid AS row_table, d.ctid AS row_id, d.*"),
    "
    ORDER BY h.first, l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id
    LIMIT $3
), locked AS (
    SELECT a.account_id, ",
    account_decodes!("a."),
    " AS decodes
    FROM tollgate_accounts AS a
    WHERE a.account_id = ANY(ARRAY(SELECT DISTINCT d.account_id FROM due AS d))
    ORDER BY a.account_id
    FOR NO KEY UPDATE OF a SKIP LOCKED
), verdict AS (
    SELECT (SELECT count(*) FROM most_overdue) AS considered, (SELECT count(*) FROM due) AS due,
        coalesce((SELECT bool_and(d.decodes) FROM due AS d), true)
            AND coalesce((SELECT bool_and(x.decodes) FROM locked AS x), true) AS decodes,
        ARRAY(SELECT x.account_id FROM locked AS x) AS locked
), settled AS (
    UPDATE tollgate_leases AS l
    SET state = 'reclaimed', settled_at = now()
    FROM verdict AS v, due AS d
    WHERE v.decodes AND d.account_id = ANY(v.locked)
      AND l.tableoid = d.row_table AND l.ctid = d.row_id AND l.account_id = d.account_id
      AND l.state = 'active' AND (l.expiry_floor_us, l.expiry_submicro_ns) <= ($1, $2)
    RETURNING l.account_id, l.lease_id, l.granted, l.used
), totals AS (
    SELECT s.account_id, sum(s.granted) AS granted, sum(s.used) AS used,
        sum(least(s.granted, s.used)) AS least, array_agg(s.lease_id ORDER BY s.lease_id) AS leases,
        array_agg(s.lease_id) AS lease_each, array_agg(s.granted) AS granted_each, array_agg(s.used) AS used_each
    FROM settled AS s
    GROUP BY s.account_id
), changes AS (
    SELECT t.account_id, t.leases,
        ARRAY(
            SELECT (t.granted * c.granted + t.used * c.used + t.least * c.least)::int8
            FROM unnest($7::int8[], $8::int8[], $9::int8[]) WITH ORDINALITY AS c(granted, used, least, i)
            ORDER BY c.i
        ) AS delta
    FROM totals AS t
), accounts AS (
    UPDATE tollgate_accounts AS a
    SET ",
    add_elements!("c.delta"),
    ", journal_seq = a.journal_seq + 1
    FROM changes AS c
    WHERE a.account_id = c.account_id
    RETURNING a.account_id, a.journal_seq
), journal AS (
    INSERT INTO tollgate_journal (",
    journal_columns!(),
    ")
    SELECT w.account_id, w.journal_seq, 'reclaim', ",
    elements!("c.delta"),
    ", NULL, NULL, c.leases, NULL, $5, $6
    FROM accounts AS w JOIN changes AS c ON c.account_id = w.account_id
    RETURNING 1
)
SELECT v.considered, v.due, v.decodes, t.account_id, t.lease_each, t.granted_each, t.used_each
FROM verdict AS v
LEFT JOIN totals AS t ON true
ORDER BY t.account_id"
);

// ------------------------------------------------------------------ reads

/// Entries of the account $1 after sequence number $2, at most $3, in
/// sequence order: a range of the primary key `(account_id, seq)`.
pub(in crate::store) const READ_JOURNAL_SQL: &str = concat!(
    "SELECT ",
    journal_columns!(),
    " FROM tollgate_journal j WHERE j.account_id = $1 AND j.seq > $2 ORDER BY j.seq LIMIT $3"
);

/// Accounts among $1 whose journal does not replay to their counters: the
/// sums of each counter's deltas, plus a new account's counters, differ from
/// the counters, or the entries are not numbered 1 to `journal_seq`. One
/// aggregate per account over its range of the primary key, for a page of
/// accounts at a time.
pub(in crate::store) const CHECK_JOURNAL_SQL: &str = "
SELECT a.account_id
FROM tollgate_accounts AS a
LEFT JOIN LATERAL (
    SELECT count(*) AS entries, coalesce(max(j.seq), 0) AS last_seq,
        coalesce(sum(j.credited), 0) AS credited, coalesce(sum(j.available), 0) AS available,
        coalesce(sum(j.reserved), 0) AS reserved, coalesce(sum(j.consumed), 0) AS consumed,
        coalesce(sum(j.overage), 0) AS overage, coalesce(sum(j.billed), 0) AS billed,
        coalesce(sum(j.next_fence), 0) AS next_fence
    FROM tollgate_journal AS j
    WHERE j.account_id = a.account_id
) AS r ON true
WHERE a.account_id = ANY($1)
  AND (r.entries, r.last_seq, r.credited, r.available, r.reserved, r.consumed, r.overage, r.billed,
       r.next_fence + 1)
      IS DISTINCT FROM (a.journal_seq, a.journal_seq, a.credited, a.available, a.reserved, a.consumed,
       a.overage, a.billed, a.next_fence)
ORDER BY a.account_id";
