//! Alert rules, webhook endpoints and deliveries: an event exactly when its
//! cause committed, one per crossing, to the endpoints that want its type;
//! each delivery attempt claimed once, retried, given up and redelivered.

use jiff::SignedDuration;
use serde_json::Value;
use tollgate_core::alerts::{ENDPOINTS_MAX, RULES_PER_ACCOUNT_MAX};
use tollgate_core::{Condition, Error, EventType, PageLimit, PageRequest};
use tollgate_store::{
    AttemptResult, ClaimedDelivery, DeliveryClaim, DeliveryState, FinishedAttempt, NewAlertRule, NewEndpoint, Outbox,
    SecretRotation, Store, UsageSink,
};

use super::T0;
use crate::StoreFactory;
use crate::support::*;

/// Far enough after every step of a case that every delivery is due.
const LATER: i128 = 1_000_000_000_000;

fn t(ns: i128) -> jiff::Timestamp {
    ts(T0 + ns)
}

/// Derives every entry not yet derived (a store that derives as it journals
/// has none left).
async fn derive_all<S: Store>(s: &S) {
    while s.derive_events(1_000).await.expect("derived") == 1_000 {}
}

/// A claim of up to `limit` deliveries, each due again `claim_for` after it,
/// passing over no endpoint.
fn claim(limit: u32, claim_for: SignedDuration) -> DeliveryClaim<'static> {
    DeliveryClaim { limit, claim_for, skip: &[] }
}

/// A rule of `account_id` watching `condition`.
fn alert_rule(account_id: &str, condition: Condition) -> NewAlertRule<'_> {
    NewAlertRule { account_id, condition }
}

/// The result of attempt `attempt` of delivery `delivery_id`.
fn finished(delivery_id: &str, attempt: u32, result: AttemptResult) -> FinishedAttempt<'_> {
    FinishedAttempt { delivery_id, attempt, result }
}

/// Every delivery due by `LATER`, each claimed once, with its body parsed.
async fn claim_all<S: Store>(s: &S) -> Vec<(ClaimedDelivery, Value)> {
    derive_all(s).await;
    let claimed = s.claim_deliveries(claim(1_000, secs(60)), t(LATER)).await.expect("claimed");
    claimed
        .into_iter()
        .map(|delivery| {
            let body = serde_json::from_str(&delivery.body).expect("an event body is JSON");
            (delivery, body)
        })
        .collect()
}

fn types(claimed: &[(ClaimedDelivery, Value)]) -> Vec<&str> {
    claimed.iter().map(|(_, body)| body["type"].as_str().expect("a type")).collect()
}

async fn endpoint<S: Store>(s: &S, url: &str, types: &[EventType]) -> String {
    s.create_endpoint(NewEndpoint { url, event_types: types, sealed_secret: b"sealed".to_vec() }, t(0))
        .await
        .expect("endpoint")
        .endpoint_id
}

/// A balance rule fires when `available` falls below its threshold, once
/// however often the balance moves below it, and recovers once when it rises
/// back; each event carries the counters after its change and its entry.
pub async fn a_balance_rule_fires_once_per_crossing_and_recovers<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 1_000).await;
    let rule = s.create_alert_rule(alert_rule("acct", Condition::AvailableBelow { units: 100 }), t(1)).await.unwrap();
    endpoint(&s, "http://127.0.0.1:9/hook", &[EventType::BalanceThresholdCrossed, EventType::BalanceRecovered]).await;
    let big = s.acquire("acct", 850, secs(60), t(2)).await.unwrap();
    s.acquire("acct", 100, secs(60), t(3)).await.unwrap();
    s.acquire("acct", 10, secs(60), t(4)).await.unwrap();
    assert!(matches!(s.acquire("acct", 1_000, secs(60), t(5)).await, Err(Error::InsufficientBalance { .. })));
    s.release("acct", &big.lease.lease_id, big.capability.expose(), t(6)).await.unwrap();
    s.acquire("acct", 800, secs(60), t(7)).await.unwrap();

    let claimed = claim_all(&s).await;
    assert_eq!(types(&claimed), ["balance.threshold_crossed", "balance.recovered", "balance.threshold_crossed"]);
    let (_, first) = &claimed[0];
    assert_eq!(first["account_id"], "acct");
    assert_eq!(first["rule_id"], rule.rule_id.as_str());
    assert_eq!(first["account"]["available"], 50);
    assert_eq!(first["account"]["reserved"], 950);
    assert_eq!(first["journal_seq"], 3);
    assert_eq!(first["created_at"], t(3).to_string());
    assert_eq!(claimed[1].1["account"]["available"], 890);
    let ids: std::collections::BTreeSet<&str> = claimed.iter().map(|(d, _)| d.event_id.as_str()).collect();
    assert_eq!(ids.len(), 3);
}

/// Percent and overage rules judge their own counters; an overage rule has
/// no recovery, since overage never falls.
pub async fn percent_and_overage_rules_cross_at_their_bounds<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 1_000).await;
    s.create_alert_rule(alert_rule("acct", Condition::AvailableBelowPercent { percent: 10 }), t(1)).await.unwrap();
    s.create_alert_rule(alert_rule("acct", Condition::OverageAbove { units: 5 }), t(1)).await.unwrap();
    endpoint(&s, "https://example.com/a", &EventType::ALL).await;
    s.acquire("acct", 900, secs(60), t(2)).await.unwrap();
    s.acquire("acct", 1, secs(60), t(3)).await.unwrap();
    let cred = credential(&s, "acct", t(3)).await;
    s.ingest(vec![overage("r1", "acct", &cred, 5, t(3))], t(4)).await.unwrap();
    s.ingest(vec![overage("r2", "acct", &cred, 1, t(3))], t(5)).await.unwrap();
    s.ingest(vec![overage("r3", "acct", &cred, 7, t(3))], t(6)).await.unwrap();
    let claimed = claim_all(&s).await;
    assert_eq!(types(&claimed), ["balance.threshold_crossed", "overage.threshold_crossed"]);
    assert_eq!(claimed[0].1["account"]["available"], 99);
    assert_eq!(claimed[1].1["account"]["overage"], 6);
}

/// A rule judges only the changes after its creation, however late they
/// are derived.
pub async fn a_rule_judges_only_changes_after_its_creation<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 1_000).await;
    endpoint(&s, "https://example.com/a", &[EventType::BalanceThresholdCrossed]).await;
    s.acquire("acct", 950, secs(60), t(1)).await.unwrap();
    s.create_alert_rule(alert_rule("acct", Condition::AvailableBelow { units: 100 }), t(2)).await.unwrap();
    s.acquire("acct", 10, secs(60), t(3)).await.unwrap();
    assert!(claim_all(&s).await.is_empty());
    s.credit("acct", "top-up", 100, t(4)).await.unwrap();
    s.acquire("acct", 100, secs(60), t(5)).await.unwrap();
    assert_eq!(types(&claim_all(&s).await), ["balance.threshold_crossed"]);
}

/// Credits and reclaims emit one event per credit and per reclaimed lease,
/// to each endpoint that wants the type and no other; a replayed credit
/// changes nothing and emits nothing.
pub async fn credits_and_reclaims_reach_the_endpoints_that_want_them<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 100)]).await;
    let credits = endpoint(&s, "https://example.com/credits", &[EventType::CreditReceived]).await;
    let reclaims = endpoint(&s, "https://example.com/reclaims", &[EventType::LeaseReclaimed]).await;
    s.credit("acct", "c1", 50, t(1)).await.unwrap();
    s.credit("acct", "c1", 50, t(2)).await.unwrap();
    let a = s.acquire("acct", 10, nanos(5), t(3)).await.unwrap();
    let b = s.acquire("acct", 20, nanos(5), t(3)).await.unwrap();
    assert_eq!(s.reclaim(t(100), 10).await.unwrap().reclaimed.len(), 2);
    let claimed = claim_all(&s).await;
    let to = |endpoint_id: &str| -> Vec<&Value> {
        claimed.iter().filter(|(d, _)| d.endpoint_id == endpoint_id).map(|(_, body)| body).collect()
    };
    let credit_events = to(&credits);
    assert_eq!(credit_events.len(), 1);
    assert_eq!(credit_events[0]["credit_id"], "c1");
    assert_eq!(credit_events[0]["units"], 50);
    assert_eq!(credit_events[0]["account"]["credited"], 150);
    let mut leases: Vec<&str> = to(&reclaims).iter().map(|body| body["lease_id"].as_str().unwrap()).collect();
    leases.sort_unstable();
    let mut expected = [a.lease.lease_id.as_str(), b.lease.lease_id.as_str()];
    expected.sort_unstable();
    assert_eq!(leases, expected);
    assert_eq!(claimed.len(), 3);
}

/// An `acquire_refused` rule fires at the first refusal, not again until an
/// entry raises `available`, then at the next refusal.
pub async fn a_refusal_rule_fires_once_until_available_rises<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 10).await;
    s.create_alert_rule(alert_rule("acct", Condition::AcquireRefused), t(1)).await.unwrap();
    endpoint(&s, "https://example.com/a", &[EventType::AcquireRefused]).await;
    assert_eq!(s.note_refusal("acct", t(2)).await.unwrap(), 1);
    assert_eq!(s.note_refusal("acct", t(3)).await.unwrap(), 0);
    let lease = s.acquire("acct", 5, secs(60), t(4)).await.unwrap();
    derive_all(&s).await;
    assert_eq!(s.note_refusal("acct", t(5)).await.unwrap(), 0);
    s.release("acct", &lease.lease.lease_id, lease.capability.expose(), t(6)).await.unwrap();
    derive_all(&s).await;
    assert_eq!(s.note_refusal("acct", t(7)).await.unwrap(), 1);
    let claimed = claim_all(&s).await;
    assert_eq!(types(&claimed), ["acquire.refused_insufficient_balance"; 2]);
    assert_eq!(claimed[0].1["journal_seq"], Value::Null);
    assert_eq!(claimed[1].1["account"]["available"], 10);
    assert_ne!(claimed[0].0.event_id, claimed[1].0.event_id);
    assert_eq!(s.note_refusal("nobody", t(8)).await, Err(Error::AccountNotFound));
}

/// Each attempt is claimed once; a claim that lapses makes the delivery due
/// again as the next attempt, and only the latest attempt records its
/// result; a retry waits until its time, a failure is final until a
/// redelivery.
pub async fn each_delivery_attempt_is_claimed_once_and_recorded_by_its_claim<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 100).await;
    let hook = endpoint(&s, "https://example.com/a", &[EventType::CreditReceived]).await;
    s.credit("acct", "c1", 5, t(10)).await.unwrap();
    derive_all(&s).await;
    assert!(s.claim_deliveries(claim(10, secs(1)), t(9)).await.unwrap().is_empty());
    let first = s.claim_deliveries(claim(10, nanos(100)), t(10)).await.unwrap();
    assert_eq!((first.len(), first[0].attempt), (1, 1));
    assert_eq!(first[0].sealed_secrets, [b"sealed".to_vec()]);
    assert!(s.claim_deliveries(claim(10, nanos(100)), t(10)).await.unwrap().is_empty());
    let second = s.claim_deliveries(claim(10, nanos(100)), t(110)).await.unwrap();
    assert_eq!((second.len(), second[0].attempt), (1, 2));
    let id = second[0].delivery_id.clone();
    let delivered = AttemptResult::Delivered { status: 200 };
    assert!(!s.finish_delivery(finished(&id, 1, delivered.clone()), t(120)).await.unwrap());
    let retry = AttemptResult::Retry { at: t(500), error: "HTTP 503".into(), status: Some(503) };
    assert!(s.finish_delivery(finished(&id, 2, retry), t(120)).await.unwrap());
    assert!(s.claim_deliveries(claim(10, nanos(100)), t(499)).await.unwrap().is_empty());
    let third = s.claim_deliveries(claim(10, nanos(100)), t(500)).await.unwrap();
    assert_eq!(third[0].attempt, 3);
    let failed = AttemptResult::Failed { error: "connection refused".into(), status: None };
    assert!(s.finish_delivery(finished(&id, 3, failed), t(510)).await.unwrap());
    assert!(s.claim_deliveries(claim(10, nanos(100)), t(LATER)).await.unwrap().is_empty());

    let log = s.deliveries(&hook, &PageRequest::default()).await.unwrap().items;
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].state, log[0].attempts), (DeliveryState::Failed, 3));
    assert_eq!((log[0].last_error.as_deref(), log[0].last_status), (Some("connection refused"), None));
    assert_eq!((log[0].next_attempt_at, log[0].created_at), (None, t(10)));
    let again = s.redeliver(&hook, &id, t(600)).await.unwrap();
    assert_eq!((again.state, again.next_attempt_at, again.attempts), (DeliveryState::Pending, Some(t(600)), 3));
    let fourth = s.claim_deliveries(claim(10, nanos(100)), t(600)).await.unwrap();
    assert_eq!(fourth[0].attempt, 4);
    assert!(s.finish_delivery(finished(&id, 4, delivered), t(601)).await.unwrap());
    let log = s.deliveries(&hook, &PageRequest::default()).await.unwrap().items;
    assert_eq!(
        (log[0].state, log[0].delivered_at, log[0].last_status),
        (DeliveryState::Delivered, Some(t(601)), Some(200))
    );
    let counts = s.outbox_counts().await.unwrap();
    assert_eq!((counts.pending, counts.delivered, counts.failed), (0, 1, 0));
    assert_eq!(s.redeliver("whe_none", &id, t(700)).await, Err(Error::DeliveryNotFound));
    assert_eq!(s.redeliver(&hook, "dlv_none", t(700)).await, Err(Error::DeliveryNotFound));
}

/// A rotated secret signs beside the new one until its overlap ends.
pub async fn a_rotated_secret_signs_until_its_overlap_ends<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 100).await;
    let hook = endpoint(&s, "https://example.com/a", &[EventType::CreditReceived]).await;
    let rotated = s
        .rotate_endpoint_secret(
            SecretRotation { endpoint_id: &hook, sealed_secret: b"new".to_vec(), previous_until: t(100) },
            t(50),
        )
        .await
        .unwrap();
    assert_eq!((rotated.rotated_at, rotated.previous_secret_until), (Some(t(50)), Some(t(100))));
    s.credit("acct", "c1", 5, t(60)).await.unwrap();
    s.credit("acct", "c2", 5, t(200)).await.unwrap();
    derive_all(&s).await;
    let during = s.claim_deliveries(claim(1, secs(1)), t(99)).await.unwrap();
    assert_eq!(during[0].sealed_secrets, [b"new".to_vec(), b"sealed".to_vec()]);
    let after = s.claim_deliveries(claim(1, secs(1)), t(200)).await.unwrap();
    assert_eq!(after[0].sealed_secrets, [b"new".to_vec()]);
    assert_eq!(
        s.rotate_endpoint_secret(
            SecretRotation { endpoint_id: "whe_none", sealed_secret: vec![1], previous_until: t(1) },
            t(1)
        )
        .await,
        Err(Error::EndpointNotFound)
    );
}

/// Rules and endpoints are validated and bounded; deleting them stops their
/// events, and an endpoint's deliveries go with it.
pub async fn rules_and_endpoints_are_validated_bounded_and_deleted<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 1_000).await;
    let below = Condition::AvailableBelow { units: 10 };
    assert_eq!(s.create_alert_rule(alert_rule("nobody", below), t(1)).await, Err(Error::AccountNotFound));
    assert_eq!(s.alert_rules("nobody").await, Err(Error::AccountNotFound));
    let mut ids = Vec::new();
    for i in 0..RULES_PER_ACCOUNT_MAX {
        ids.push(s.create_alert_rule(alert_rule("acct", below), t(i as i128)).await.unwrap().rule_id);
    }
    let over = s.create_alert_rule(alert_rule("acct", below), t(99)).await;
    assert_eq!(over, Err(Error::TooManyRules { max: RULES_PER_ACCOUNT_MAX }));
    let listed: Vec<String> = s.alert_rules("acct").await.unwrap().into_iter().map(|r| r.rule_id).collect();
    assert_eq!(listed, ids);
    for id in &ids {
        s.delete_alert_rule("acct", id).await.unwrap();
    }
    assert_eq!(s.delete_alert_rule("acct", &ids[0]).await, Err(Error::RuleNotFound));
    assert!(s.alert_rules("acct").await.unwrap().is_empty());

    let bad = s
        .create_endpoint(
            NewEndpoint { url: "ftp://example.com", event_types: &[EventType::CreditReceived], sealed_secret: vec![1] },
            t(1),
        )
        .await;
    assert_eq!(bad, Err(Error::InvalidWebhookUrl));
    assert_eq!(
        s.create_endpoint(NewEndpoint { url: "https://example.com", event_types: &[], sealed_secret: vec![1] }, t(1))
            .await,
        Err(Error::InvalidEventTypes)
    );
    let mut endpoints = Vec::new();
    for i in 0..ENDPOINTS_MAX {
        endpoints.push(endpoint(&s, &format!("https://example.com/{i}"), &[EventType::CreditReceived]).await);
    }
    let over = s
        .create_endpoint(
            NewEndpoint {
                url: "https://example.com/x",
                event_types: &[EventType::CreditReceived],
                sealed_secret: vec![1],
            },
            t(1),
        )
        .await;
    assert_eq!(over, Err(Error::TooManyEndpoints { max: ENDPOINTS_MAX }));
    let listed: Vec<String> = s.endpoints().await.unwrap().into_iter().map(|e| e.endpoint_id).collect();
    assert_eq!(listed, endpoints);
    s.credit("acct", "c1", 5, t(2)).await.unwrap();
    derive_all(&s).await;
    assert_eq!(s.outbox_counts().await.unwrap().pending, ENDPOINTS_MAX as u64);
    for id in &endpoints[1..] {
        s.delete_endpoint(id).await.unwrap();
    }
    assert_eq!(s.delete_endpoint(&endpoints[1]).await, Err(Error::EndpointNotFound));
    assert_eq!(s.deliveries(&endpoints[1], &PageRequest::default()).await, Err(Error::EndpointNotFound));
    assert_eq!(s.outbox_counts().await.unwrap().pending, 1);
    assert_eq!(claim_all(&s).await.len(), 1);
}

/// The delivery log pages in creation order, and its cursor belongs to its
/// endpoint.
pub async fn the_delivery_log_pages_in_creation_order<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 100).await;
    let hook = endpoint(&s, "https://example.com/a", &[EventType::CreditReceived]).await;
    let other = endpoint(&s, "https://example.com/b", &[EventType::LeaseReclaimed]).await;
    for i in 1..=5 {
        s.credit("acct", &format!("c{i}"), 1, t(i * 1_000)).await.unwrap();
    }
    derive_all(&s).await;
    let limit = PageLimit::new(Some(2)).unwrap();
    let mut seen = Vec::new();
    let mut page = s.deliveries(&hook, &PageRequest::first(limit)).await.unwrap();
    loop {
        seen.extend(page.items.iter().map(|d| d.created_at));
        let Some(cursor) = page.next_cursor.clone() else { break };
        let foreign = s.deliveries(&other, &PageRequest::after(cursor.clone(), limit)).await;
        assert_eq!(foreign, Err(Error::InvalidCursor));
        page = s.deliveries(&hook, &PageRequest::after(cursor, limit)).await.unwrap();
    }
    assert_eq!(seen, (1..=5).map(|i| t(i * 1_000)).collect::<Vec<_>>());
}

/// A claim passes over the endpoints it is asked to skip, leaving their
/// deliveries due.
pub async fn a_claim_passes_over_the_endpoints_it_skips<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    funded(&s, "acct", 100).await;
    let busy = endpoint(&s, "https://example.com/busy", &[EventType::CreditReceived]).await;
    let idle = endpoint(&s, "https://example.com/idle", &[EventType::CreditReceived]).await;
    s.credit("acct", "c1", 5, t(10)).await.unwrap();
    derive_all(&s).await;
    let claimed = s
        .claim_deliveries(DeliveryClaim { limit: 10, claim_for: secs(1), skip: std::slice::from_ref(&busy) }, t(10))
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|d| d.endpoint_id.as_str()).collect::<Vec<_>>(), [idle.as_str()]);
    let rest = s.claim_deliveries(claim(10, secs(1)), t(10)).await.unwrap();
    assert_eq!(rest.iter().map(|d| d.endpoint_id.as_str()).collect::<Vec<_>>(), [busy.as_str()]);
}

/// A change that is refused, or rolled back whole, emits nothing: a credit
/// conflict, a refused acquire (without an `acquire_refused` rule), and a
/// usage batch refused because it would overflow a counter, which would
/// have crossed an overage rule.
pub async fn refused_and_rolled_back_changes_emit_nothing<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(secs(1))).await;
    let max = s.unit_domain().max();
    funded(&s, "acct", 10).await;
    s.create_alert_rule(alert_rule("acct", Condition::OverageAbove { units: 0 }), t(1)).await.unwrap();
    s.create_alert_rule(alert_rule("acct", Condition::AvailableBelow { units: 5 }), t(1)).await.unwrap();
    endpoint(&s, "https://example.com/a", &EventType::ALL).await;
    let cred = credential(&s, "acct", t(2)).await;
    assert!(matches!(s.credit("acct", "seed-acct", 11, t(3)).await, Err(Error::CreditConflict { .. })));
    assert!(matches!(s.acquire("acct", 11, secs(60), t(4)).await, Err(Error::InsufficientBalance { .. })));
    let lease = s.acquire("acct", 10, secs(60), t(5)).await.unwrap();
    let big = overage("big", "acct", &cred, max - 5, t(5));
    let small = leased("small", &cred, &lease, 6, t(6));
    let refused = s.ingest(vec![big, small], t(6)).await;
    assert!(matches!(refused, Err(tollgate_core::IngestError::Refused { .. })), "{refused:?}");
    let claimed = claim_all(&s).await;
    assert_eq!(types(&claimed), ["balance.threshold_crossed"], "only the acquire that committed");
}
