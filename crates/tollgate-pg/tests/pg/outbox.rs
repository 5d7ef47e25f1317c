//! The outbox on PostgreSQL alone: two servers (two pools on one database)
//! claiming and deriving at once, a claim that lapses while its attempt is
//! still out, a refusal that comes before the deriver reached the entry that
//! re-armed its rule, accounts that existed before migration 0024, and
//! accounts whose entries do not apply to their cursor, which derivation
//! skips without stopping the others.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use tollgate_core::{Condition, EventType, GrantPolicy, PageRequest};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_store::{
    AttemptResult, DeliveryClaim, DeliveryState, FinishedAttempt, NewAlertRule, NewEndpoint, Outbox, Store,
};

use crate::fixtures::migrated_through;

const T0: i128 = 1_700_000_000_123_456_789;

/// A claim of up to `limit` deliveries, each due again `claim_for` after it,
/// passing over no endpoint.
fn claim(limit: u32, claim_for: SignedDuration) -> DeliveryClaim<'static> {
    DeliveryClaim { limit, claim_for, skip: &[] }
}

/// The result of attempt `attempt` of delivery `delivery_id`.
fn finished(delivery_id: &str, attempt: u32, result: AttemptResult) -> FinishedAttempt<'_> {
    FinishedAttempt { delivery_id, attempt, result }
}

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(T0 + ns).expect("instant in the domain")
}

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3_600), SignedDuration::from_secs(1), 100).expect("valid policy")
}

/// Two stores on one database, each with its own pool, as two servers.
async fn two_servers() -> (Arc<PostgresStore>, Arc<PostgresStore>) {
    let db = TestDb::create().await;
    let second_pool = db.new_pool(4).await;
    let one = PostgresStore::on_test_db(db, policy()).await.expect("first server");
    let two = PostgresStore::from_pool(second_pool, policy()).await.expect("second server");
    (Arc::new(one), Arc::new(two))
}

async fn endpoint(s: &PostgresStore, url: &str, types: &[EventType]) -> String {
    s.create_endpoint(NewEndpoint { url, event_types: types, sealed_secret: b"sealed".to_vec() }, ts(0))
        .await
        .expect("endpoint")
        .endpoint_id
}

/// `accounts` accounts, each credited `credits` times (one journal entry
/// each), at distinct instants after the endpoints' creation at `ts(0)`.
async fn credited(s: &PostgresStore, accounts: usize, credits: usize) {
    for a in 0..accounts {
        let account_id = format!("acct-{a}");
        s.create_account(&account_id).await.expect("account");
        for c in 0..credits {
            let at = ts(i128::try_from(a * credits + c + 1).expect("small") * 1_000);
            s.credit(&account_id, &format!("c{c}"), 10, at).await.expect("credit");
        }
    }
}

async fn derive_all(s: &PostgresStore) -> u32 {
    let mut derived = 0;
    loop {
        let n = s.derive_events(1_000).await.expect("derived");
        derived += n;
        if n < 1_000 {
            return derived;
        }
    }
}

async fn count(s: &PostgresStore, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(s.pool()).await.expect("count")
}

/// Claims until a claim finds nothing due at `now`, returning each claimed
/// `(delivery, attempt)`.
async fn claim_until_dry(s: Arc<PostgresStore>, now: Timestamp, claim_for: SignedDuration) -> Vec<(String, u32)> {
    let mut claimed = Vec::new();
    loop {
        let batch = s.claim_deliveries(claim(7, claim_for), now).await.expect("claim");
        if batch.is_empty() {
            return claimed;
        }
        claimed.extend(batch.into_iter().map(|delivery| (delivery.delivery_id, delivery.attempt)));
    }
}

/// Two servers claiming the same due deliveries at once never make the same
/// attempt of a delivery twice: in each round every delivery is claimed
/// exactly once, by one of them, as that round's attempt; the claims of one
/// round lapse before the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_claiming_at_once_never_claim_the_same_attempt() {
    const ROUNDS: u32 = 3;
    let (one, two) = two_servers().await;
    for i in 0..3 {
        endpoint(&one, &format!("https://example.com/{i}"), &[EventType::CreditReceived]).await;
    }
    credited(&one, 10, 4).await;
    assert_eq!(derive_all(&one).await, 40);
    let deliveries = 40 * 3;

    let mut seen = BTreeSet::new();
    for round in 0..ROUNDS {
        let now = ts(1_000_000_000 + i128::from(round) * 10_000_000_000);
        let claim_for = SignedDuration::from_secs(5);
        let (a, b) = tokio::join!(
            tokio::spawn(claim_until_dry(Arc::clone(&one), now, claim_for)),
            tokio::spawn(claim_until_dry(Arc::clone(&two), now, claim_for)),
        );
        let claimed: Vec<(String, u32)> = a.expect("first").into_iter().chain(b.expect("second")).collect();
        assert_eq!(claimed.len(), deliveries, "round {round}: every delivery claimed once");
        for (delivery_id, attempt) in claimed {
            assert_eq!(attempt, round + 1, "{delivery_id}");
            assert!(seen.insert((delivery_id, attempt)), "an attempt was claimed twice");
        }
    }
    assert_eq!(seen.len(), deliveries * ROUNDS as usize);
    assert_eq!(one.outbox_counts().await.expect("counts").pending, deliveries as u64);
}

/// Two servers deriving at once derive each journal entry exactly once:
/// the entries they report add up to the journal, each event and delivery
/// is stored once, and every cursor ends at its account's journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_deriving_at_once_derive_each_entry_once() {
    const ENTRIES: u32 = 12 * 10;
    let (one, two) = two_servers().await;
    endpoint(&one, "https://example.com/a", &[EventType::CreditReceived, EventType::BalanceRecovered]).await;
    endpoint(&one, "https://example.com/b", &[EventType::CreditReceived]).await;
    for a in 0..12 {
        let account_id = format!("acct-{a}");
        one.create_account(&account_id).await.expect("account");
        let rule = NewAlertRule { account_id: &account_id, condition: Condition::AvailableBelow { units: 25 } };
        one.create_alert_rule(rule, ts(0)).await.expect("rule");
    }
    // A new account's balance is below the threshold; the third credit of
    // each account (20 -> 30) recovers it, and every credit is received.
    for c in 0..10 {
        for a in 0..12 {
            one.credit(&format!("acct-{a}"), &format!("c{c}"), 10, ts(i128::from(c + 1) * 1_000))
                .await
                .expect("credit");
        }
    }

    let total = Arc::new(AtomicU32::new(0));
    let derive = |s: Arc<PostgresStore>, total: Arc<AtomicU32>| async move {
        for _ in 0..10_000 {
            if total.load(Ordering::SeqCst) >= ENTRIES {
                return;
            }
            let n = s.derive_events(7).await.expect("derived");
            total.fetch_add(n, Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(derive(Arc::clone(&one), Arc::clone(&total))),
        tokio::spawn(derive(Arc::clone(&two), Arc::clone(&total))),
    );
    a.expect("first");
    b.expect("second");
    assert_eq!(total.load(Ordering::SeqCst), ENTRIES);
    assert_eq!(one.derive_events(1_000).await.expect("derived"), 0);

    // 120 credits and one recovery per account; the credits go to both
    // endpoints, the recoveries to the first.
    assert_eq!(count(&one, "SELECT count(*) FROM tollgate_webhook_events").await, 120 + 12);
    assert_eq!(count(&one, "SELECT count(*) FROM tollgate_webhook_deliveries").await, 120 * 2 + 12);
    let behind = count(
        &one,
        "SELECT count(*) FROM tollgate_accounts a \
         LEFT JOIN tollgate_outbox_cursors c ON c.account_id = a.account_id \
         WHERE c.seq IS DISTINCT FROM a.journal_seq",
    )
    .await;
    assert_eq!(behind, 0);
}

/// A claim that lapses while its attempt is still out makes the delivery due
/// again as attempt 2, on another server; the first attempt's result,
/// arriving afterwards, is refused and records nothing, and the second's is
/// recorded.
#[tokio::test]
async fn a_lapsed_claim_is_claimed_again_and_its_late_result_is_refused() {
    let (one, two) = two_servers().await;
    let hook = endpoint(&one, "https://example.com/a", &[EventType::CreditReceived]).await;
    credited(&one, 1, 1).await;
    derive_all(&one).await;

    let first = one.claim_deliveries(claim(10, SignedDuration::from_nanos(100)), ts(1_010)).await.expect("claim");
    assert_eq!(first.iter().map(|d| d.attempt).collect::<Vec<_>>(), [1]);
    assert!(two.claim_deliveries(claim(10, SignedDuration::from_secs(60)), ts(1_109)).await.expect("claim").is_empty());
    let second = two.claim_deliveries(claim(10, SignedDuration::from_secs(60)), ts(1_110)).await.expect("claim");
    assert_eq!(
        second.iter().map(|d| (d.delivery_id.as_str(), d.attempt)).collect::<Vec<_>>(),
        [(first[0].delivery_id.as_str(), 2)]
    );

    let id = &first[0].delivery_id;
    let late = one
        .finish_delivery(finished(id, 1, AttemptResult::Delivered { status: 200 }), ts(1_120))
        .await
        .expect("finish");
    assert!(!late, "the lapsed attempt's result is refused");
    let log = one.deliveries(&hook, &PageRequest::default()).await.expect("log").items;
    assert_eq!((log[0].state, log[0].attempts), (DeliveryState::Pending, 2));
    assert_eq!((log[0].last_status, log[0].last_error.as_deref(), log[0].delivered_at), (None, None, None));
    assert_eq!(log[0].next_attempt_at, Some(ts(1_110) + SignedDuration::from_secs(60)));

    let done = two
        .finish_delivery(finished(id, 2, AttemptResult::Delivered { status: 204 }), ts(1_130))
        .await
        .expect("finish");
    assert!(done);
    let log = one.deliveries(&hook, &PageRequest::default()).await.expect("log").items;
    assert_eq!(
        (log[0].state, log[0].last_status, log[0].delivered_at),
        (DeliveryState::Delivered, Some(204), Some(ts(1_130)))
    );
}

/// A refusal fires a rule that an entry re-armed even before the deriver
/// reached that entry, as the memory store (which re-arms as it journals)
/// would; deriving that entry afterwards does not re-arm the rule again.
#[tokio::test]
async fn a_refusal_sees_a_rearming_entry_not_yet_derived() {
    let (one, _two) = two_servers().await;
    endpoint(&one, "https://example.com/a", &[EventType::AcquireRefused]).await;
    one.create_account("acct").await.expect("account");
    let rule = NewAlertRule { account_id: "acct", condition: Condition::AcquireRefused };
    one.create_alert_rule(rule, ts(0)).await.expect("rule");
    assert_eq!(one.note_refusal("acct", ts(1)).await.expect("refusal"), 1);
    assert_eq!(one.note_refusal("acct", ts(2)).await.expect("refusal"), 0);
    one.credit("acct", "c1", 5, ts(3)).await.expect("credit");
    assert_eq!(one.note_refusal("acct", ts(4)).await.expect("refusal"), 1, "the credit re-armed the rule");
    assert_eq!(derive_all(&one).await, 1);
    assert_eq!(one.note_refusal("acct", ts(5)).await.expect("refusal"), 0);
    let rules = one.alert_rules("acct").await.expect("rules");
    assert_eq!(rules[0].refused_at_seq, Some(1));
    let claimed = one.claim_deliveries(claim(10, SignedDuration::from_secs(60)), ts(1_000)).await.expect("claim");
    assert_eq!(claimed.len(), 2);
}

/// Accounts that existed when 0024 ran start deriving after their journal's
/// last entry then, from their counters then; accounts created later derive
/// from their first entry, from a new account's counters.
#[tokio::test]
async fn accounts_from_before_0024_derive_only_later_entries() {
    let db = migrated_through(23).await;
    sqlx::raw_sql(
        "INSERT INTO tollgate_accounts (account_id, credited, available, reserved, next_fence, journal_seq)
         VALUES ('old', 100, 100, 0, 1, 1);
         INSERT INTO tollgate_credits (account_id, credit_id, units) VALUES ('old', 'c0', 100);
         INSERT INTO tollgate_journal (account_id, seq, kind, credited, available, reserved, consumed, overage,
             billed, next_fence, credit_id, at_floor_us, at_submicro_ns)
         VALUES ('old', 1, 'credit', 100, 100, 0, 0, 0, 0, 0, 'c0', 1700000000000000, 0);",
    )
    .execute(db.pool())
    .await
    .expect("an account written before 0024");
    let s = PostgresStore::on_test_db(db, policy()).await.expect("startup applies 0024");
    assert!(s.check().await.expect("check").is_clean());
    endpoint(&s, "https://example.com/a", &[EventType::CreditReceived]).await;
    assert_eq!(s.derive_events(100).await.expect("derived"), 0, "the entry before 0024 is not derived");

    s.credit("old", "c1", 50, ts(1)).await.expect("credit");
    s.create_account("new").await.expect("account");
    s.credit("new", "c1", 7, ts(2)).await.expect("credit");
    assert_eq!(derive_all(&s).await, 2);
    let claimed = s.claim_deliveries(claim(10, SignedDuration::from_secs(60)), ts(1_000)).await.expect("claim");
    let bodies: Vec<Value> = claimed.iter().map(|d| serde_json::from_str(&d.body).expect("JSON")).collect();
    let seen: Vec<(&str, &Value, &Value)> = bodies
        .iter()
        .map(|body| (body["account_id"].as_str().expect("account"), &body["journal_seq"], &body["account"]["credited"]))
        .collect();
    assert_eq!(seen, [("old", &Value::from(2), &Value::from(150)), ("new", &Value::from(1), &Value::from(7))]);
}

/// Deriving late judges each entry by the rules and endpoints of its time:
/// a rule deleted before the deriver reached an entry made while it existed
/// still emits that entry's event (and is removed once derived past), and an
/// endpoint created after an entry's cause does not receive its event.
#[tokio::test]
async fn late_derivation_judges_entries_by_the_rules_and_endpoints_of_their_time() {
    let s = PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store");
    let early = endpoint(&s, "https://example.com/early", &EventType::ALL).await;
    s.create_account("acct").await.expect("account");
    s.credit("acct", "c1", 100, ts(1)).await.expect("credit");
    let request = NewAlertRule { account_id: "acct", condition: Condition::AvailableBelow { units: 50 } };
    let rule = s.create_alert_rule(request, ts(2)).await.expect("rule");
    s.acquire("acct", 60, SignedDuration::from_secs(60), ts(3)).await.expect("acquire");
    s.delete_alert_rule("acct", &rule.rule_id).await.expect("deleted");
    assert!(s.alert_rules("acct").await.expect("rules").is_empty());
    assert_eq!(s.delete_alert_rule("acct", &rule.rule_id).await, Err(tollgate_core::Error::RuleNotFound));
    let late = s
        .create_endpoint(
            NewEndpoint {
                url: "https://example.com/late",
                event_types: &EventType::ALL,
                sealed_secret: b"sealed".to_vec(),
            },
            ts(10),
        )
        .await
        .expect("endpoint")
        .endpoint_id;
    s.credit("acct", "c2", 5, ts(20)).await.expect("credit");
    s.acquire("acct", 45, SignedDuration::from_secs(60), ts(21)).await.expect("acquire");

    assert_eq!(derive_all(&s).await, 4);
    assert_eq!(count(&s, "SELECT count(*) FROM tollgate_alert_rules").await, 0, "removed once derived past");
    let claimed = s.claim_deliveries(claim(10, SignedDuration::from_secs(60)), ts(1_000)).await.expect("claim");
    let mut seen: Vec<(&str, String)> = claimed
        .iter()
        .map(|d| {
            let body: Value = serde_json::from_str(&d.body).expect("JSON");
            let to = if d.endpoint_id == early { "early" } else { "late" };
            (to, body["type"].as_str().expect("type").to_owned())
        })
        .collect();
    seen.sort();
    let expected = [
        ("early", "balance.threshold_crossed"),
        ("early", "credit.received"),
        ("early", "credit.received"),
        ("late", "credit.received"),
    ];
    assert_eq!(seen, expected.map(|(to, kind)| (to, kind.to_owned())));
    assert_ne!(late, early);
}

/// A store with an endpoint for credits and the accounts `ids`, each
/// credited 100 and derived, so that each has an outbox cursor.
async fn derived_accounts(ids: &[&str]) -> PostgresStore {
    let s = PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store");
    endpoint(&s, "https://example.com/a", &[EventType::CreditReceived]).await;
    for account_id in ids {
        s.create_account(account_id).await.expect("account");
        s.credit(account_id, "c1", 100, ts(1)).await.expect("credit");
    }
    assert_eq!(derive_all(&s).await, u32::try_from(ids.len()).expect("few"));
    s
}

/// An account's cursor: its sequence number and `available`.
async fn cursor(s: &PostgresStore, account_id: &str) -> (i64, i64) {
    sqlx::query_as("SELECT seq, available FROM tollgate_outbox_cursors WHERE account_id = $1")
        .bind(account_id)
        .fetch_one(s.pool())
        .await
        .expect("cursor")
}

/// Sets `account_id`'s cursor's `available` (0 breaks it for an entry that
/// takes from `available`).
async fn set_cursor_available(s: &PostgresStore, account_id: &str, available: i64) {
    sqlx::query("UPDATE tollgate_outbox_cursors SET available = $2 WHERE account_id = $1")
        .bind(account_id)
        .bind(available)
        .execute(s.pool())
        .await
        .expect("cursor set");
}

async fn journal_seq(s: &PostgresStore, account_id: &str) -> i64 {
    sqlx::query_scalar("SELECT journal_seq FROM tollgate_accounts WHERE account_id = $1")
        .bind(account_id)
        .fetch_one(s.pool())
        .await
        .expect("journal_seq")
}

/// An account's stored events and deliveries.
async fn outbox_of(s: &PostgresStore, account_id: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM tollgate_webhook_events WHERE account_id = $1), \
                (SELECT count(*) FROM tollgate_webhook_deliveries WHERE account_id = $1)",
    )
    .bind(account_id)
    .fetch_one(s.pool())
    .await
    .expect("counts")
}

/// Takes 40 from `available`: an entry that does not apply to a cursor
/// holding 0.
async fn acquire_40(s: &PostgresStore, account_id: &str, at: Timestamp) {
    s.acquire(account_id, 40, SignedDuration::from_secs(60), at).await.expect("acquire");
}

/// `passes` derivation passes of bound `limit`, each one's answer.
async fn passes(s: &PostgresStore, limit: u32, passes: usize) -> Vec<u32> {
    let mut derived = Vec::with_capacity(passes);
    for _ in 0..passes {
        derived.push(s.derive_events(limit).await.expect("derived"));
    }
    derived
}

/// An account whose next journal entry does not apply to its cursor's
/// counters stops only itself: a pass derives the other account (its events,
/// its deliveries, its cursor up to its journal), leaves the broken
/// account's cursor where it was, and once the cursor row is repaired the
/// next pass derives the broken account's entries.
#[tokio::test]
async fn an_account_whose_entries_do_not_apply_is_skipped_until_repaired() {
    let s = derived_accounts(&["acct-a", "acct-b"]).await;
    assert_eq!(cursor(&s, "acct-a").await, (1, 100));
    set_cursor_available(&s, "acct-a", 0).await;
    acquire_40(&s, "acct-a", ts(10)).await;
    s.credit("acct-a", "c2", 5, ts(11)).await.expect("credit");
    s.credit("acct-b", "c2", 7, ts(12)).await.expect("credit");
    s.credit("acct-b", "c3", 8, ts(13)).await.expect("credit");

    assert_eq!(s.derive_events(1_000).await.expect("derived"), 2, "acct-b's two entries");
    assert_eq!(cursor(&s, "acct-b").await.0, journal_seq(&s, "acct-b").await);
    assert_eq!(outbox_of(&s, "acct-b").await, (3, 3), "each credit's event and delivery");
    assert_eq!(cursor(&s, "acct-a").await, (1, 0), "the broken account's cursor stays");
    assert_eq!(outbox_of(&s, "acct-a").await, (1, 1), "nothing of the broken account is stored");
    assert_eq!(s.derive_events(1_000).await.expect("derived"), 0, "skipped again until repaired");

    set_cursor_available(&s, "acct-a", 100).await;
    assert_eq!(s.derive_events(1_000).await.expect("derived"), 2, "the acquire and the credit");
    assert_eq!(cursor(&s, "acct-a").await, (journal_seq(&s, "acct-a").await, 65));
    assert_eq!(outbox_of(&s, "acct-a").await, (2, 2), "the credits' events; the acquire emits none");
    assert_eq!(s.derive_events(1_000).await.expect("derived"), 0);
}

/// `acct-a`, `acct-b` and `acct-c` derived, with `acct-a`, first in account
/// order, broken by an entry its cursor cannot apply.
async fn behind_a_broken_account() -> PostgresStore {
    let s = derived_accounts(&["acct-a", "acct-b", "acct-c"]).await;
    set_cursor_available(&s, "acct-a", 0).await;
    acquire_40(&s, "acct-a", ts(10)).await;
    s
}

/// A broken account first in account order with more pending entries than
/// a pass's bound does not stop the accounts after it: each pass reads past
/// its entries and derives up to its bound of the others'.
#[tokio::test]
async fn a_pass_reads_past_a_skipped_account_with_more_entries_than_its_bound() {
    let s = behind_a_broken_account().await;
    for c in 2..=3 {
        s.credit("acct-a", &format!("c{c}"), 1, ts(10 + c)).await.expect("credit");
        s.credit("acct-b", &format!("c{c}"), 1, ts(20 + c)).await.expect("credit");
    }
    s.credit("acct-b", "c4", 1, ts(24)).await.expect("credit");
    s.credit("acct-c", "c2", 1, ts(30)).await.expect("credit");

    assert_eq!(passes(&s, 2, 3).await, [2, 2, 0]);
    for account_id in ["acct-b", "acct-c"] {
        assert_eq!(cursor(&s, account_id).await.0, journal_seq(&s, account_id).await, "{account_id}");
    }
    assert_eq!(cursor(&s, "acct-a").await, (1, 0));
}

/// When the bound cuts short the last account of a read that skipped one,
/// the pass leaves that account whole to its next read, so that a pass that
/// derives fewer entries than its bound has left nothing derivable.
#[tokio::test]
async fn a_pass_rereads_an_account_its_bound_cut_short_next_to_a_skipped_one() {
    let s = behind_a_broken_account().await;
    for c in 2..=4 {
        s.credit("acct-b", &format!("c{c}"), 1, ts(20 + c)).await.expect("credit");
    }
    s.credit("acct-c", "c2", 1, ts(30)).await.expect("credit");

    // Each pass's first read is acct-a's entry and acct-b's first.
    assert_eq!(passes(&s, 2, 3).await, [2, 2, 0]);
    for account_id in ["acct-b", "acct-c"] {
        assert_eq!(cursor(&s, account_id).await.0, journal_seq(&s, account_id).await, "{account_id}");
    }
    assert_eq!(outbox_of(&s, "acct-b").await, (4, 4));
    assert_eq!(cursor(&s, "acct-a").await, (1, 0));
}
