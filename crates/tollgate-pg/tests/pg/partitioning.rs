//! The proof that the schema shards by account: every store statement is
//! classified, and every single-account statement, planned generically on a
//! schema whose per-account tables are hash-partitioned by `account_id` into
//! `HASH_PARTITIONS` partitions (`TestDb::create_partitioned`), scans exactly
//! one partition of each per-account table it touches. Batch statements must
//! filter each per-account table by an account list. (The conformance suite
//! runs on the same partitioned schema in `conformance.rs`.)

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sqlx::{Connection, PgConnection, Row};
use tollgate_pg::testing::{HASH_PARTITIONS, TestDb, store_statements};

/// How a statement relates to accounts.
enum Class {
    /// A request-path statement of one account. `params` are its parameters
    /// as `(type, SQL literal)`, in order.
    Single { params: &'static [(&'static str, &'static str)] },
    /// A batch (usage ingestion, reclaim settlement) grouped by account: each
    /// listed per-account table is reached only through each listed condition,
    /// which matches its rows against the accounts the batch names (an
    /// INSERT routes each row by its own `account_id`).
    Batch { account_filters: &'static [(&'static str, &'static str)] },
    /// An operator or global statement, and why it need not be of one account.
    Global { why: &'static str },
}

use Class::{Batch, Global, Single};

const ACCOUNT: (&str, &str) = ("text", "'acct-3'");
const LEASE: (&str, &str) = ("text", "'lease-3-1'");
const CREDENTIAL: (&str, &str) = ("text", "'cred-3'");
const COUNTERS: (&str, &str) = ("int8[]", "'{100,60,40,0,0,0,3}'");
const HASH: (&str, &str) = ("bytea", "'\\x0003'");
const INT8: (&str, &str) = ("int8", "1");
const INT2: (&str, &str) = ("int2", "0");

const CONTROL: &str = "transaction control; touches no table";
const CHECK: &str = "the operator's check reads every account, page by page, in one snapshot";
const RECLAIM_SCAN: &str = "the reclaim worker finds the most overdue leases of every account, in expiry \
     order, and then reads each of their accounts' due leases by account (ReclaimPass::accounts); what \
     it settles is locked and written grouped by account (LOCK_DUE_SQL, SETTLE_IF_UNCHANGED_SQL, \
     PERSIST_SQL)";
const RECLAIM_PASS: &str = "the reclaim worker's pass in one statement is RECLAIM_SCAN's read and \
     SETTLE_IF_UNCHANGED_SQL's write together: it finds the most overdue leases of every account, then \
     reads, locks, settles and journals by the accounts those leases name; a deployment whose engine \
     cannot run it across shards runs it per shard group (docs/scaling.md)";
const LEASE_SUMMARY: &str = "the fleet's lease summary counts the active and due leases of every \
     account, an operator's and monitor's read of the whole fleet; it reads active leases only, through \
     the partial index tollgate_leases_active_expiry (tests/pg/lease_summary_index.rs), never the settled \
     ones";
const SETTINGS: &str = "tollgate_settings, migrations and the clock are global (a reference table)";
const PURGE: &str = "the worker purges expired idempotency records of every account, in bounded batches";
const LEGACY_KEYS: &str = "a key issued before keys named their account is looked up by its hash in \
     tollgate_legacy_credential_keys, a global read-only directory (a reference table, replicated to \
     every node) that names the key's account; the credential is then read on that account \
     (CREDENTIAL_BY_KEY_SQL, single-account)";
const FOREIGN_CREDENTIALS: &str = "usage ingestion reads, unlocked, only the credentials its events name \
     that none of the batch's accounts holds (LOCK_CREDENTIALS_SQL found them under no such account), \
     to reject those events as credential_account_mismatch rather than unknown_credential \
     (docs/rules.md); a batch whose credentials are its own accounts' never runs it";

const ADVISORY: &str = "an advisory lock (deriving events, creating an endpoint) is one per deployment; it \
     touches no table";
const ENDPOINTS: &str = "webhook endpoints belong to no account: tollgate_webhook_endpoints is global, small \
     and written only by operators (a reference table)";
const DERIVER: &str = "the event deriver finds the accounts whose journal is past their outbox cursor, of \
     every account, in account order and bounded (LIMIT), and reads each one's entries by account; what \
     it stores is written grouped by account (STORE_DERIVED_SQL)";
const ENDPOINT_DELIVERIES: &str = "an endpoint's deliveries span the accounts whose events it asked for: its \
     delivery log, one bounded page (LIMIT) after its cursor, its redelivery, and the deletion of its \
     deliveries with it go by endpoint";
const DELIVERY_WORKER: &str = "the delivery worker claims the due deliveries of every account in due order, \
     in bounded batches (LIMIT), and records each attempt's result by the delivery id its claim returned, \
     which does not carry the account; the operator's counts read every delivery";

const ACCOUNT_LISTING: &str = "the operator's listing of accounts (an admin console's search by id \
     prefix) reads every account in account_id order, one bounded page (LIMIT) after its cursor; each \
     account's active lease count is a subquery by that account's id";

/// The usage totals' parameters: the account, the head's and the tail's
/// bounds, the window, the grouping and its key, and the whole hours.
const USAGE_TOTALS_PARAMS: &[(&str, &str)] = &[
    ACCOUNT,
    INT8,
    INT2,
    INT8,
    INT2,
    INT8,
    INT2,
    INT8,
    INT2,
    INT8,
    ("text", "'dimension'"),
    ("text", "'model'"),
    INT8,
    INT8,
];

/// Every statement of `src/store/sql.rs`, classified.
fn classification() -> BTreeMap<&'static str, Class> {
    BTreeMap::from([
        ("BEGIN_SQL", Global { why: CONTROL }),
        ("CUSTOM_PLANS_SQL", Global { why: CONTROL }),
        ("COMMIT_SQL", Global { why: CONTROL }),
        ("ROLLBACK_SQL", Global { why: CONTROL }),
        ("CREATE_ACCOUNT_SQL", Single { params: &[ACCOUNT, COUNTERS] }),
        ("READ_ACCOUNT_SQL", Single { params: &[ACCOUNT] }),
        ("LOCK_ACCOUNT_SQL", Single { params: &[ACCOUNT] }),
        ("LOCK_ACCOUNTS_SQL", Batch { account_filters: &[("tollgate_accounts", "a.account_id = ANY($1)")] }),
        (
            "LOCK_ACCOUNTS_SKIP_LOCKED_SQL",
            Batch { account_filters: &[("tollgate_accounts", "a.account_id = ANY($1)")] },
        ),
        ("ACCOUNT_VIEW_SQL", Single { params: &[ACCOUNT] }),
        ("CREDIT_RECORDED_SQL", Single { params: &[ACCOUNT, ("text", "'credit-3'")] }),
        ("CREDIT_SQL", Single { params: &[ACCOUNT, ("text", "'credit-9'"), INT8, INT8, INT8, COUNTERS, INT8, INT2] }),
        ("READ_LEASE_SQL", Single { params: &[ACCOUNT, LEASE] }),
        ("LOCK_ACCOUNT_LEASES_SQL", Single { params: &[ACCOUNT, ("text[]", "'{lease-3-1,lease-3-2}'")] }),
        ("LOCK_LEASES_SQL", Batch { account_filters: &[("tollgate_leases", "l.account_id = ANY($2)")] }),
        ("READ_HELD_LEASE_SQL", Single { params: &[ACCOUNT, LEASE] }),
        ("LOCK_HELD_LEASE_SQL", Single { params: &[ACCOUNT, LEASE] }),
        ("READ_DUE_SQL", Global { why: RECLAIM_SCAN }),
        ("LOCK_DUE_SQL", Batch { account_filters: &[("tollgate_leases", "l.account_id = ANY($1)")] }),
        ("LEASE_SUMMARY_SQL", Global { why: LEASE_SUMMARY }),
        ("CREDENTIAL_BY_KEY_SQL", Single { params: &[ACCOUNT, HASH] }),
        ("LEGACY_KEY_ACCOUNT_SQL", Global { why: LEGACY_KEYS }),
        ("READ_CREDENTIAL_SQL", Single { params: &[ACCOUNT, CREDENTIAL] }),
        ("LOCK_CREDENTIAL_SQL", Single { params: &[ACCOUNT, CREDENTIAL] }),
        ("LOCK_CREDENTIALS_SQL", Batch { account_filters: &[("tollgate_credentials", "c.account_id = ANY($2)")] }),
        ("READ_CREDENTIALS_ANY_ACCOUNT_SQL", Global { why: FOREIGN_CREDENTIALS }),
        (
            "INSERT_CREDENTIAL_SQL",
            Single { params: &[("text", "'cred-new'"), ACCOUNT, ("text", "'label'"), HASH, INT8, INT2] },
        ),
        ("REVOKE_CREDENTIAL_SQL", Single { params: &[ACCOUNT, CREDENTIAL, INT8, INT2] }),
        ("RECORDED_EVENTS_SQL", Batch { account_filters: &[("tollgate_usage_events", "u.account_id = ANY($1)")] }),
        (
            "PERSIST_SQL",
            Batch {
                account_filters: &[
                    ("tollgate_accounts", "WHERE a.account_id = u.account_id"),
                    ("tollgate_leases", "WHERE l.account_id = u.account_id AND l.lease_id = u.lease_id"),
                    ("tollgate_leases", "INSERT INTO tollgate_leases"),
                    ("tollgate_credentials", "WHERE c.account_id = u.account_id AND c.credential_id = u.credential_id"),
                    ("tollgate_usage_events", "INSERT INTO tollgate_usage_events"),
                    ("tollgate_journal", "INSERT INTO tollgate_journal"),
                ],
            },
        ),
        (
            "ACQUIRE_IF_UNCHANGED_SQL",
            Single {
                params: &[
                    ACCOUNT,
                    COUNTERS,
                    COUNTERS,
                    ("text", "'lease-new'"),
                    INT8,
                    HASH,
                    INT8,
                    INT8,
                    ("text", "'active'"),
                    INT8,
                    INT2,
                    ("bool", "false"),
                    COUNTERS,
                    INT8,
                    INT2,
                ],
            },
        ),
        ("RELEASE_READ_IF_UNCHANGED_SQL", Single { params: RELEASE_PARAMS }),
        ("RELEASE_GUESSED_IF_UNCHANGED_SQL", Single { params: RELEASE_GUESSED_PARAMS }),
        (
            "SETTLE_IF_UNCHANGED_SQL",
            Batch {
                account_filters: &[
                    ("tollgate_accounts", "WHERE a.account_id = ANY($1)"),
                    ("tollgate_leases", "AND l.account_id = k.account_id"),
                    ("tollgate_journal", "INSERT INTO tollgate_journal"),
                ],
            },
        ),
        ("RECLAIM_DUE_SQL", Global { why: RECLAIM_PASS }),
        ("CHECK_ACCOUNTS_SQL", Global { why: CHECK }),
        ("CHECK_LEASES_SQL", Global { why: CHECK }),
        ("CHECK_USAGE_HOURLY_SQL", Global { why: CHECK }),
        ("LEGACY_BOUNDS_SQL", Global { why: CHECK }),
        ("CHECK_SNAPSHOT_SQL", Global { why: CHECK }),
        ("APPLIED_MIGRATIONS_SQL", Global { why: SETTINGS }),
        ("SHARED_CLOCK_SQL", Global { why: SETTINGS }),
        ("REPLACE_SETTING_SQL", Global { why: SETTINGS }),
        ("PIN_SETTING_SQL", Global { why: SETTINGS }),
        ("CLAIM_KEY_SQL", Single { params: &[ACCOUNT, HASH, HASH, INT8, INT2, INT8, INT2] }),
        ("RECORDED_KEY_SQL", Single { params: &[ACCOUNT, HASH] }),
        ("RECORD_KEY_SQL", Single { params: &[ACCOUNT, HASH, HASH] }),
        ("PURGE_KEYS_SQL", Global { why: PURGE }),
        ("LIST_ACCOUNTS_SQL", Global { why: ACCOUNT_LISTING }),
        ("LIST_LEASES_SQL", Single { params: &[ACCOUNT, ("text", "''"), ("text[]", "'{active,released}'"), INT8] }),
        ("LIST_CREDENTIALS_SQL", Single { params: &[ACCOUNT, ("text", "''"), INT8] }),
        ("LIST_CREDITS_SQL", Single { params: &[ACCOUNT, ("text", "''"), INT8] }),
        ("USAGE_TOTALS_SQL", Single { params: USAGE_TOTALS_PARAMS }),
        ("USAGE_HOURS_SQL", Single { params: USAGE_TOTALS_PARAMS }),
        ("USAGE_EVENTS_FIRST_SQL", Single { params: &[ACCOUNT, INT8, INT2, INT8, INT2, INT8] }),
        (
            "USAGE_EVENTS_AFTER_SQL",
            Single { params: &[ACCOUNT, INT8, INT2, INT8, INT2, INT8, INT2, ("text", "'r-3'"), INT8] },
        ),
        ("READ_JOURNAL_SQL", Single { params: &[ACCOUNT, INT8, INT8] }),
        ("CHECK_JOURNAL_SQL", Global { why: CHECK }),
        ("TRY_DERIVE_LOCK_SQL", Global { why: ADVISORY }),
        ("ENDPOINTS_LOCK_SQL", Global { why: ADVISORY }),
        ("LOCK_ACCOUNT_SEQ_SQL", Single { params: &[ACCOUNT] }),
        (
            "INSERT_RULE_SQL",
            Single {
                params: &[
                    ACCOUNT,
                    ("text", "'rule-new'"),
                    ("text", "'available_below'"),
                    INT8,
                    INT8,
                    INT2,
                    INT8,
                    ("int8", "20"),
                ],
            },
        ),
        ("READ_RULES_SQL", Single { params: &[ACCOUNT] }),
        ("RETIRE_RULE_SQL", Single { params: &[ACCOUNT, ("text", "'rule-3'")] }),
        ("PURGE_RETIRED_RULES_SQL", Single { params: &[ACCOUNT] }),
        ("LOCK_REFUSAL_RULES_SQL", Single { params: &[ACCOUNT] }),
        ("REFUSAL_ACCOUNT_SQL", Single { params: &[ACCOUNT] }),
        ("LOCK_DERIVE_RULES_SQL", Batch { account_filters: &[("tollgate_alert_rules", "r.account_id = ANY($1)")] }),
        ("INSERT_ENDPOINT_SQL", Global { why: ENDPOINTS }),
        ("READ_ENDPOINTS_SQL", Global { why: ENDPOINTS }),
        ("READ_ENDPOINT_SQL", Global { why: ENDPOINTS }),
        ("SHARE_ENDPOINTS_SQL", Global { why: ENDPOINTS }),
        ("DELETE_ENDPOINT_SQL", Global { why: ENDPOINTS }),
        ("ROTATE_SECRET_SQL", Global { why: ENDPOINTS }),
        ("DELETE_ENDPOINT_DELIVERIES_SQL", Global { why: ENDPOINT_DELIVERIES }),
        ("LIST_DELIVERIES_SQL", Global { why: ENDPOINT_DELIVERIES }),
        ("REDELIVER_SQL", Global { why: ENDPOINT_DELIVERIES }),
        ("DERIVE_PENDING_SQL", Global { why: DERIVER }),
        (
            "STORE_DERIVED_SQL",
            Batch {
                account_filters: &[
                    ("tollgate_webhook_events", "INSERT INTO tollgate_webhook_events"),
                    ("tollgate_webhook_deliveries", "INSERT INTO tollgate_webhook_deliveries"),
                    ("tollgate_outbox_cursors", "INSERT INTO tollgate_outbox_cursors"),
                    ("tollgate_alert_rules", "WHERE r.account_id = u.account_id AND r.rule_id = u.rule_id"),
                    ("tollgate_alert_rules", "WHERE p.account_id = u.account_id AND p.rule_id = u.rule_id"),
                ],
            },
        ),
        ("CLAIM_DELIVERIES_SQL", Global { why: DELIVERY_WORKER }),
        ("FINISH_DELIVERY_SQL", Global { why: DELIVERY_WORKER }),
        ("OUTBOX_COUNTS_SQL", Global { why: DELIVERY_WORKER }),
    ])
}

/// Account, lease, used, state, change, fence, capability, granted, expiry.
const RELEASE_PARAMS: &[(&str, &str)] = &[
    ACCOUNT,
    LEASE,
    INT8,
    ("text", "'released'"),
    COUNTERS,
    INT8,
    HASH,
    INT8,
    INT8,
    INT2,
    ("bool", "false"),
    INT8,
    INT2,
];
const RELEASE_GUESSED_PARAMS: &[(&str, &str)] = &[
    ACCOUNT,
    LEASE,
    INT8,
    ("text", "'released'"),
    COUNTERS,
    INT8,
    HASH,
    INT8,
    INT8,
    INT2,
    ("bool", "false"),
    INT8,
    INT2,
    COUNTERS,
];

/// The names of the `const NAME: &str` items of `src/store/sql.rs` and of the
/// files of `src/store/sql/`, read from their source, so that a statement
/// added to any of them is seen here.
fn statement_constants_in_source() -> BTreeSet<String> {
    let store = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store");
    let mut paths = vec![std::path::PathBuf::from(format!("{store}/sql.rs"))];
    if let Ok(entries) = std::fs::read_dir(format!("{store}/sql")) {
        paths.extend(
            entries.map(|entry| entry.expect("entry").path()).filter(|path| path.extension() == Some("rs".as_ref())),
        );
    }
    paths
        .iter()
        .flat_map(|path| {
            let source = std::fs::read_to_string(path).expect("statement source");
            source
                .lines()
                .filter_map(|line| {
                    let line = line.trim_start();
                    let rest = match line.strip_prefix("pub(") {
                        Some(visibility) => visibility.split_once(") ")?.1,
                        None => line,
                    };
                    let rest = rest.strip_prefix("const ")?;
                    let (name, ty) = rest.split_once(':')?;
                    ty.trim_start().starts_with("&str").then(|| name.trim().to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Per-account tables named in `sql` (the names are never a prefix of one
/// another followed by an identifier character).
fn tables_named(sql: &str, per_account: &BTreeSet<String>) -> BTreeSet<String> {
    per_account
        .iter()
        .filter(|table| {
            sql.match_indices(table.as_str())
                .any(|(at, _)| !sql[at + table.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
        })
        .cloned()
        .collect()
}

#[test]
fn every_store_statement_is_classified() {
    let in_source = statement_constants_in_source();
    assert!(in_source.len() >= 40, "parsed only {in_source:?}");
    let exported: BTreeSet<String> = store_statements().iter().map(|(name, _)| (*name).to_owned()).collect();
    let classified: BTreeSet<String> = classification().keys().map(|name| (*name).to_owned()).collect();
    assert_eq!(exported, in_source, "testing::store_statements() must list every constant of sql.rs");
    assert_eq!(classified, in_source, "every constant of sql.rs must be classified here");
    for (name, class) in classification() {
        if let Global { why } = class {
            assert!(!why.is_empty(), "{name}");
        }
    }
}

/// Every `sqlx::query*`/`sqlx::raw_sql` call in a store source file takes a
/// statement constant (or a variable holding one), never a string literal,
/// so `sql.rs` holds every statement this test classifies.
#[test]
fn store_code_runs_only_statements_from_sql_rs() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store");
    let mut calls = 0;
    let mut literals = Vec::new();
    // The store's code, and its modules' folders; `sql/` holds the statements.
    let folders = [dir.to_owned(), format!("{dir}/outbox")];
    let mut files: Vec<_> = folders
        .iter()
        .flat_map(|folder| std::fs::read_dir(folder).expect("a store folder").map(|e| e.expect("entry").path()))
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if name == "sql.rs" || !name.ends_with(".rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("source");
        for (at, _) in source.match_indices("sqlx::") {
            let rest = &source[at + "sqlx::".len()..];
            if !(rest.starts_with("query") || rest.starts_with("raw_sql")) {
                continue;
            }
            let ident_end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            let mut rest = &rest[ident_end..];
            if let Some(generic) = rest.strip_prefix("::<") {
                let mut depth = 1;
                let end = generic
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '<' => 1,
                            '>' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map(|(i, _)| i + 1)
                    .expect("closed turbofish");
                rest = &generic[end..];
            }
            let Some(argument) = rest.strip_prefix('(') else { continue };
            calls += 1;
            let argument = argument.trim_start();
            if argument.starts_with('"') || argument.starts_with("r\"") || argument.starts_with("r#") {
                literals.push(format!("{name}: {}", &source[at..at + 60.min(source.len() - at)]));
            }
        }
    }
    assert!(calls >= 30, "found only {calls} sqlx calls");
    assert_eq!(literals, Vec::<String>::new(), "store code passes SQL literals to sqlx");
}

#[tokio::test]
async fn batch_statements_filter_every_per_account_table_by_their_accounts() {
    let db = TestDb::create_migrated().await;
    let per_account: BTreeSet<String> = db.per_account_tables().await.into_iter().map(|t| t.name).collect();
    db.drop_now().await;
    assert!(per_account.len() >= 6, "{per_account:?}");
    let statements: BTreeMap<&str, &str> = store_statements().iter().copied().collect();
    let mut failures = Vec::new();
    for (name, class) in classification() {
        let Batch { account_filters } = class else { continue };
        let sql = statements[name];
        let filtered: BTreeSet<String> = account_filters.iter().map(|(table, _)| (*table).to_owned()).collect();
        let named = tables_named(sql, &per_account);
        let mut problems = Vec::new();
        if filtered != named {
            problems.push(format!("touches {named:?}, but filters are given for {filtered:?}"));
        }
        for (table, condition) in account_filters {
            let by_accounts = condition.contains("account_id") || condition.starts_with("INSERT INTO");
            if !by_accounts || !sql.contains(condition) {
                problems.push(format!("{table}: `{condition}` is not in the statement or not by account"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("{name}: {}", problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "batch statements not filtered by account:\n{}", failures.join("\n"));
}

/// Sixteen accounts, each with a credit, two leases (one active), a
/// credential, a usage event, an idempotency record, an alert rule, an outbox
/// cursor, and a webhook event with its delivery, so every partition holds
/// rows.
const POPULATE: &str = "
    INSERT INTO tollgate_accounts (account_id, credited, available, reserved, next_fence)
        SELECT 'acct-' || i, 100, 60, 40, 3 FROM generate_series(0, 15) i;
    INSERT INTO tollgate_credits (account_id, credit_id, units)
        SELECT 'acct-' || i, 'credit-' || i, 100 FROM generate_series(0, 15) i;
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, used,
        state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
        SELECT 'lease-' || i || '-' || n, 'acct-' || i, n, '\\x00', 40, 0,
            CASE n WHEN 1 THEN 'active' ELSE 'released' END, 1000 * i, 0, false
        FROM generate_series(0, 15) i, generate_series(1, 2) n;
    INSERT INTO tollgate_credentials (credential_id, account_id, label, key_hash,
        created_floor_us, created_submicro_ns)
        SELECT 'cred-' || i, 'acct-' || i, 'gateway', decode(lpad(to_hex(i), 4, '0'), 'hex'), 0, 0
        FROM generate_series(0, 15) i;
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
        occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token)
        SELECT 'acct-' || i, 'r-' || i, 'cred-' || i, 0, 0, 0, 'lease-' || i || '-1', 1
        FROM generate_series(0, 15) i;
    INSERT INTO tollgate_idempotency_keys (account_id, lookup_id, fingerprint, sealed_answer,
        created_floor_us, created_submicro_ns, expires_floor_us, expires_submicro_ns)
        SELECT 'acct-' || i, sha256(('k' || i)::bytea), sha256(('f' || i)::bytea), '\\x', 0, 0, 1, 0
        FROM generate_series(0, 15) i;
    INSERT INTO tollgate_alert_rules (account_id, rule_id, kind, threshold, created_floor_us,
        created_submicro_ns, from_seq, refused_at_seq, ordinal)
        SELECT 'acct-' || i, 'rule-' || i, 'acquire_refused', NULL, 0, 0, 0, NULL, 1
        FROM generate_series(0, 15) i;
    INSERT INTO tollgate_outbox_cursors (account_id, seq, credited, available, reserved, consumed, overage,
        billed, next_fence)
        SELECT 'acct-' || i, 0, 0, 0, 0, 0, 0, 0, 1 FROM generate_series(0, 15) i;
    INSERT INTO tollgate_webhook_events (account_id, event_id, event_type, body, created_floor_us,
        created_submicro_ns)
        SELECT 'acct-' || i, 'evt-' || i, 'credit.received', '{}', 0, 0 FROM generate_series(0, 15) i;
    INSERT INTO tollgate_webhook_deliveries (account_id, delivery_id, endpoint_id, event_id, event_type,
        state, attempts, next_attempt_floor_us, next_attempt_submicro_ns, created_floor_us, created_submicro_ns)
        SELECT 'acct-' || i, 'dlv-' || i, 'whe-1', 'evt-' || i, 'credit.received', 'pending', 0, 0, 0, 0, 0
        FROM generate_series(0, 15) i;
    ANALYZE;
";

/// Partitions of per-account tables: partition name → table name.
async fn partitions(conn: &mut PgConnection) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, p.relname::text FROM pg_inherits i \
         JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent \
         WHERE c.relkind = 'r'",
    )
    .fetch_all(conn)
    .await
    .expect("partitions");
    rows.into_iter().collect()
}

/// What a plan does with the per-account tables: for each scan of a
/// partition, its table and the nearest Append above it (partitions under
/// one Append are one scan of the table, of which that many partitions
/// survived pruning); and the tables inserted into (each row is routed to
/// its one partition).
#[derive(Default)]
struct PlanUse {
    /// (table, Append id or a unique id for a lone scan) → partitions scanned.
    scans: BTreeMap<(String, usize), usize>,
    inserted: BTreeSet<String>,
    /// Appends whose partitions but one were pruned at executor startup.
    pruned_to_one: usize,
    next_id: usize,
}

fn walk(plan: &Value, append: Option<usize>, partitions: &BTreeMap<String, String>, out: &mut PlanUse) {
    out.next_id += 1;
    let id = out.next_id;
    let node_type = plan["Node Type"].as_str().unwrap_or_default();
    let relation = plan["Relation Name"].as_str().unwrap_or_default();
    if node_type == "ModifyTable" {
        if plan["Operation"] == "Insert" {
            out.inserted.insert(relation.to_owned());
        }
    } else if let Some(table) = partitions.get(relation) {
        *out.scans.entry((table.clone(), append.unwrap_or(id))).or_default() += 1;
    } else if !relation.is_empty() && partitions.values().any(|t| t == relation) {
        // A scan of a partitioned table itself cannot happen; count it as all.
        *out.scans.entry((relation.to_owned(), id)).or_default() += HASH_PARTITIONS as usize;
    }
    if plan["Subplans Removed"].as_u64() == Some(u64::from(HASH_PARTITIONS - 1)) {
        out.pruned_to_one += 1;
    }
    let append = if matches!(node_type, "Append" | "Merge Append") { Some(id) } else { append };
    for child in plan["Plans"].as_array().into_iter().flatten() {
        walk(child, append, partitions, out);
    }
}

/// On the partitioned schema, planned generically (as the store's connections
/// plan), every single-account statement scans exactly one partition of each
/// per-account table it touches: PostgreSQL 15 prunes the others at executor
/// startup from the parameters ("Subplans Removed").
#[tokio::test]
async fn single_account_statements_scan_one_partition_per_table() {
    let db = TestDb::create_partitioned().await;
    sqlx::raw_sql(POPULATE).execute(db.pool()).await.expect("populate");
    let per_account: BTreeSet<String> = db.per_account_tables().await.into_iter().map(|t| t.name).collect();
    let mut conn = PgConnection::connect_with(&db.connect_options()).await.expect("connection");
    let partitions = partitions(&mut conn).await;
    assert_eq!(partitions.len(), per_account.len() * HASH_PARTITIONS as usize);
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await.expect("generic plans");

    let statements: BTreeMap<&str, &str> = store_statements().iter().copied().collect();
    let mut checked = 0;
    let mut pruned_to_one = 0;
    let mut failures = Vec::new();
    for (i, (name, class)) in classification().into_iter().enumerate() {
        let Single { params } = class else { continue };
        let sql = statements[name];
        let types: Vec<&str> = params.iter().map(|(ty, _)| *ty).collect();
        let values: Vec<&str> = params.iter().map(|(_, value)| *value).collect();
        let prepare = format!("PREPARE s{i} ({}) AS {sql}", types.join(", "));
        sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: PREPARE failed: {e}"));
        let explain = format!("EXPLAIN (FORMAT JSON) EXECUTE s{i} ({})", values.join(", "));
        let row = sqlx::raw_sql(sqlx::AssertSqlSafe(explain))
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: EXPLAIN failed: {e}"));
        let text = row.try_get_raw(0).expect("plan").as_str().expect("plan text").to_owned();
        let json: Value = serde_json::from_str(&text).expect("plan JSON");
        let mut used = PlanUse::default();
        walk(&json[0]["Plan"], None, &partitions, &mut used);
        checked += 1;
        pruned_to_one += used.pruned_to_one;

        let mut problems = Vec::new();
        for table in tables_named(sql, &per_account) {
            let scans: Vec<usize> =
                used.scans.iter().filter(|((t, _), _)| *t == table).map(|(_, count)| *count).collect();
            if scans.is_empty() && !used.inserted.contains(&table) {
                problems.push(format!("{table} is named but neither scanned nor inserted into"));
            }
            if scans.iter().any(|count| *count != 1) {
                problems.push(format!("{table}: partitions scanned per scan {scans:?}, expected 1 each"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("{name}: {}", problems.join("; ")));
        }
    }
    assert!(checked >= 20, "checked only {checked} statements");
    // The plans were generic and pruned at executor startup, not at planning.
    assert!(pruned_to_one >= checked / 2, "only {pruned_to_one} Appends pruned to one partition at startup");
    drop(conn);
    db.drop_now().await;
    assert!(failures.is_empty(), "statements scanning more than one partition:\n{}", failures.join("\n"));
}
