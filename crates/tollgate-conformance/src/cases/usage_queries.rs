//! Usage dimensions, usage totals by window and group, and exports: the same
//! answers from every store, to the nanosecond.

use std::collections::BTreeSet;

use tollgate_core::query::{ExportQuery, GroupBy, Range, UsageQuery, Window};
use tollgate_core::{Dimensions, Error, PageLimit, UsageEvent, UsageReport};
use tollgate_store::{Store, UsageSink};

use super::{T0, ingest_codes};
use crate::StoreFactory;
use crate::support::*;

/// A minute boundary (1 700 000 040 s since the epoch).
const B: i128 = 1_700_000_040_000_000_000;
const MINUTE: i128 = 60_000_000_000;
const HOUR: i128 = 60 * MINUTE;
const DAY: i128 = 24 * HOUR;

fn with(mut event: UsageEvent, pairs: &[(&str, &str)]) -> UsageEvent {
    event.dimensions = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    event
}

fn query(from: i128, to: i128, window: Option<Window>, group_by: GroupBy) -> UsageQuery {
    UsageQuery::new(Range::new(ts(from), ts(to)).expect("range"), window, group_by).expect("query")
}

/// Each bucket as `(start, end, [(key, units, events)])`, instants in ns.
type Buckets = Vec<(i128, i128, Vec<(Option<String>, u128, u128)>)>;

fn buckets(report: &UsageReport) -> Buckets {
    report
        .buckets
        .iter()
        .map(|b| {
            let groups = b.groups.iter().map(|g| (g.key.clone(), g.totals.units, g.totals.events)).collect();
            (b.start.as_nanosecond(), b.end.as_nanosecond(), groups)
        })
        .collect()
}

fn one(key: Option<&str>, units: u128, events: u128) -> (Option<String>, u128, u128) {
    (key.map(str::to_owned), units, events)
}

/// Every event of `account_id` in `[from, to)`, page by page with `limit`.
async fn export_all<S: Store>(s: &S, account_id: &str, from: i128, to: i128, limit: u32) -> Vec<UsageEvent> {
    let range = Range::new(ts(from), ts(to)).expect("range");
    let limit = PageLimit::new(Some(limit)).expect("limit");
    let mut page_query = ExportQuery::new(account_id, range, None, limit).expect("query");
    let mut all = Vec::new();
    loop {
        let page = s.usage_events(account_id, &page_query).await.expect("page");
        assert!(page.items.len() <= limit.rows());
        all.extend(page.items);
        match page.next_cursor {
            None => return all,
            Some(cursor) => page_query = page_query.resume(account_id, &cursor).expect("own cursor"),
        }
    }
}

/// "An invalid set of dimensions rejects its event with
/// `invalid_dimensions`; duplicate detection comes first, so a replay with
/// other dimensions is a duplicate; a rejected id stays free." Accepted
/// dimensions are exported exactly as reported.
pub async fn dimensions_are_validated_after_duplicates<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 0)]).await;
    let now = ts(T0);
    let c = credential(&s, "a", now).await;
    let e = |id: &str| overage(id, "a", &c, 1, ts(B));
    let nine: Vec<(String, String)> = (0..9).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let nine: Vec<(&str, &str)> = nine.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let long_key = "k".repeat(65);
    let long_value = "v".repeat(257);
    let batch = vec![
        with(e("ok"), &[("model", "gpt-4o"), ("route", "/v1/chat")]),
        with(e("upper"), &[("Model", "x")]),
        with(e("empty-key"), &[("", "x")]),
        with(e("long-key"), &[(&long_key, "x")]),
        with(e("bad-char"), &[("mo del", "x")]),
        with(e("empty-value"), &[("model", "")]),
        with(e("nul-value"), &[("model", "a\0b")]),
        with(e("long-value"), &[("model", &long_value)]),
        with(e("nine"), &nine),
        with(e("ok"), &[("model", "other")]),
    ];
    let codes = ingest_codes(&s, batch, now).await;
    let bad = |id: &str| format!("{id}:rejected:invalid_dimensions");
    let expected = [
        "ok:accepted".to_owned(),
        bad("upper"),
        bad("empty-key"),
        bad("long-key"),
        bad("bad-char"),
        bad("empty-value"),
        bad("nul-value"),
        bad("long-value"),
        bad("nine"),
        "ok:duplicate".to_owned(),
    ];
    assert_eq!(codes, expected);
    assert_ledger(&s, "a", ledger! { overage: 1, billed: 1 }).await;

    // A replay with other dimensions in a later batch is a duplicate; a
    // rejected id, corrected, is accepted; the widest valid set is accepted.
    let widest: Vec<(String, String)> = (0..8).map(|i| (format!("{}{i}", "k".repeat(63)), "é".repeat(256))).collect();
    let widest: Vec<(&str, &str)> = widest.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let batch = vec![with(e("ok"), &[]), with(e("upper"), &[("model", "x")]), with(e("nine"), &widest)];
    assert_eq!(ingest_codes(&s, batch, now).await, ["ok:duplicate", "upper:accepted", "nine:accepted"]);
    assert_ledger(&s, "a", ledger! { overage: 3, billed: 3 }).await;

    let exported = export_all(&s, "a", B, B + 1, 10).await;
    let ids: Vec<&str> = exported.iter().map(|e| e.request_id.as_str()).collect();
    assert_eq!(ids, ["nine", "ok", "upper"]);
    assert_eq!(exported[0].dimensions.len(), 8);
    assert_eq!(exported[1], with(e("ok"), &[("model", "gpt-4o"), ("route", "/v1/chat")]));
    assert_eq!(exported[2].dimensions, Dimensions::from([("model".to_owned(), "x".to_owned())]));
}

/// "`occurred_at` in `[from, to)`, exact to the nanosecond": an event at
/// `from` counts, one at `to` does not, and one nanosecond before a window
/// boundary lands in the earlier bucket. Partial windows at both ends are
/// buckets of their own, clipped to the range; empty buckets are listed.
pub async fn usage_windows_are_exact_to_the_nanosecond<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 0)]).await;
    let now = ts(T0);
    let c = credential(&s, "a", now).await;
    let from = B - 7;
    let to = B + 2 * MINUTE + 5;
    let at = |id: &str, ns: i128, units: u64| overage(id, "a", &c, units, ts(ns));
    let batch = vec![
        at("before-from", from - 1, 1),
        at("at-from", from, 2),
        at("last-of-first", B - 1, 4),
        at("first-of-second", B, 8),
        at("last-of-second", B + MINUTE - 1, 16),
        at("last-in-range", to - 1, 32),
        at("at-to", to, 64),
    ];
    assert!(ingest_codes(&s, batch, now).await.iter().all(|code| code.ends_with(":accepted")));

    let report = s.usage("a", &query(from, to, Some(Window::Minute), GroupBy::Nothing)).await.unwrap();
    let expected: Buckets = vec![
        (from, B, vec![one(None, 6, 2)]),
        (B, B + MINUTE, vec![one(None, 24, 2)]),
        (B + MINUTE, B + 2 * MINUTE, vec![]),
        (B + 2 * MINUTE, to, vec![one(None, 32, 1)]),
    ];
    assert_eq!(buckets(&report), expected);
    assert_eq!((report.total.units, report.total.events), (62, 5));

    let whole = s.usage("a", &query(from, to, None, GroupBy::Nothing)).await.unwrap();
    assert_eq!(buckets(&whole), vec![(from, to, vec![one(None, 62, 5)])]);
    let empty = s.usage("a", &query(to + 1, to + 2, None, GroupBy::Nothing)).await.unwrap();
    assert_eq!(buckets(&empty), vec![(to + 1, to + 2, vec![])]);
    assert_eq!((empty.total.units, empty.total.events), (0, 0));
}

/// Windows are UTC-aligned by floor division before 1970 too: the day
/// bucket of an instant one nanosecond before the epoch starts a day before
/// it, and hours before the epoch are whole hours.
pub async fn usage_before_the_epoch<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 0)]).await;
    let now = ts(T0);
    let c = credential(&s, "a", now).await;
    let at = |id: &str, ns: i128, units: u64| overage(id, "a", &c, units, ts(ns));
    let batch = vec![
        at("e-1", -1, 1),
        at("epoch", 0, 2),
        at("day-1", -DAY, 4),
        at("day-1-less", -DAY - 1, 8),
        at("hour", -HOUR - 999, 16),
    ];
    assert!(ingest_codes(&s, batch, now).await.iter().all(|code| code.ends_with(":accepted")));

    let days = s.usage("a", &query(-2 * DAY, DAY, Some(Window::Day), GroupBy::Nothing)).await.unwrap();
    let expected: Buckets = vec![
        (-2 * DAY, -DAY, vec![one(None, 8, 1)]),
        (-DAY, 0, vec![one(None, 21, 3)]),
        (0, DAY, vec![one(None, 2, 1)]),
    ];
    assert_eq!(buckets(&days), expected);

    let hours = s.usage("a", &query(-2 * HOUR - 1, 1, Some(Window::Hour), GroupBy::Nothing)).await.unwrap();
    let expected: Buckets = vec![
        (-2 * HOUR - 1, -2 * HOUR, vec![]),
        (-2 * HOUR, -HOUR, vec![one(None, 16, 1)]),
        (-HOUR, 0, vec![one(None, 1, 1)]),
        (0, 1, vec![one(None, 2, 1)]),
    ];
    assert_eq!(buckets(&hours), expected);
}

/// Grouping by credential, lease (overage events form the `None` group),
/// funding (`leased`/`overage`) and a dimension (events without it form the
/// `None` group, distinct from every value); other accounts' events never
/// count.
pub async fn usage_groups_by_credential_lease_funding_and_dimension<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 100), ("b", 100)]).await;
    let now = ts(T0);
    let (c1, c2, cb) = (credential(&s, "a", now).await, credential(&s, "a", now).await, credential(&s, "b", now).await);
    let lease = s.acquire("a", 50, secs(60), now).await.unwrap();
    let other = s.acquire("b", 50, secs(60), now).await.unwrap();
    let lease_id = lease.lease.lease_id.clone();
    let batch = vec![
        with(leased("l1", &c1, &lease, 1, ts(B)), &[("model", "x")]),
        with(leased("l2", &c2, &lease, 2, ts(B + 1)), &[("model", "y"), ("route", "r")]),
        with(overage("o1", "a", &c1, 4, ts(B + 2)), &[("route", "r")]),
        overage("o2", "a", &c2, 8, ts(B + 3)),
        with(leased("b1", &cb, &other, 16, ts(B)), &[("model", "x")]),
    ];
    assert!(ingest_codes(&s, batch, now).await.iter().all(|code| code.ends_with(":accepted")));
    let groups = |report: &UsageReport| buckets(report).remove(0).2;
    let run = |group_by: GroupBy| {
        let s = &s;
        async move { groups(&s.usage("a", &query(B, B + MINUTE, None, group_by)).await.unwrap()) }
    };
    let mut by_credential = vec![one(Some(&c1), 5, 2), one(Some(&c2), 10, 2)];
    by_credential.sort();
    assert_eq!(run(GroupBy::Credential).await, by_credential);
    assert_eq!(run(GroupBy::Lease).await, vec![one(None, 12, 2), one(Some(&lease_id), 3, 2)]);
    assert_eq!(run(GroupBy::Funding).await, vec![one(Some("leased"), 3, 2), one(Some("overage"), 12, 2)]);
    assert_eq!(
        run(GroupBy::Dimension("model".into())).await,
        vec![one(None, 12, 2), one(Some("x"), 1, 1), one(Some("y"), 2, 1)]
    );
    assert_eq!(run(GroupBy::Dimension("route".into())).await, vec![one(None, 9, 2), one(Some("r"), 6, 2)]);
    assert_eq!(run(GroupBy::Dimension("absent".into())).await, vec![one(None, 15, 4)]);
    assert_eq!(run(GroupBy::Nothing).await, vec![one(None, 15, 4)]);
    let b = s.usage("b", &query(B, B + MINUTE, None, GroupBy::Nothing)).await.unwrap();
    assert_eq!(groups(&b), vec![one(None, 16, 1)]);
}

/// Refusals: a range spanning more than 10 000 windows is refused before
/// any store is asked; an unknown account is `account_not_found` for both
/// queries and exports.
pub async fn usage_refusals<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 0)]).await;
    let range = |from: i128, to: i128| Range::new(ts(from), ts(to)).expect("range");
    let edge = UsageQuery::new(range(B, B + 10_000 * MINUTE), Some(Window::Minute), GroupBy::Nothing);
    assert_eq!(s.usage("a", &edge.unwrap()).await.unwrap().buckets.len(), 10_000);
    let over = UsageQuery::new(range(B - 1, B + 10_000 * MINUTE - 1), Some(Window::Minute), GroupBy::Nothing);
    assert_eq!(over, Err(Error::TooManyBuckets { buckets: 10_001, max: 10_000 }));
    assert_eq!(Range::new(ts(B), ts(B)), Err(Error::InvalidRange));
    let q = query(B, B + 1, None, GroupBy::Nothing);
    assert_eq!(s.usage("ghost", &q).await.unwrap_err(), Error::AccountNotFound);
    let page = ExportQuery::new("ghost", range(B, B + 1), None, PageLimit::default()).unwrap();
    assert_eq!(s.usage_events("ghost", &page).await.unwrap_err(), Error::AccountNotFound);
}

/// Exports list events in `(occurred_at, request_id)` order; paging never
/// skips or repeats an event, even while events are accepted between pages
/// (one sorting after the cursor shows up, one before it does not); a
/// cursor of another account or range is `invalid_cursor`.
pub async fn usage_exports_page_in_order<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 0), ("b", 0)]).await;
    let now = ts(T0);
    let c = credential(&s, "a", now).await;
    let cb = credential(&s, "b", now).await;
    let at = |id: &str, ns: i128| overage(id, "a", &c, 1, ts(ns));
    let batch = vec![
        at("r-b", B + 5),
        at("r-a", B + 5),
        at("r-c", B - 3),
        at("r-z", B + 10),
        at("R-0", B + 5),
        at("x", B + 99),
    ];
    s.ingest(batch, now).await.unwrap();
    s.ingest(vec![overage("b-1", "b", &cb, 1, ts(B))], now).await.unwrap();
    let range = Range::new(ts(B - 3), ts(B + 99)).expect("range");
    let limit = PageLimit::new(Some(2)).unwrap();

    let first_query = ExportQuery::new("a", range, None, limit).unwrap();
    let first = s.usage_events("a", &first_query).await.unwrap();
    let ids = |events: &[UsageEvent]| events.iter().map(|e| e.request_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first.items), ["r-c", "R-0"]);
    let cursor = first.next_cursor.expect("more pages");

    // Accepted between pages: one before the cursor, one after it, one at
    // the cursor's instant sorting after it, one out of range.
    let late = vec![at("a-early", B - 2), at("r-y", B + 7), at("r-aa", B + 5), at("late", B + 99)];
    s.ingest(late, now).await.unwrap();

    let mut seen = first.items;
    let mut next = first_query.resume("a", &cursor).unwrap();
    loop {
        let page = s.usage_events("a", &next).await.unwrap();
        seen.extend(page.items);
        match page.next_cursor {
            None => break,
            Some(cursor) => next = next.resume("a", &cursor).unwrap(),
        }
    }
    assert_eq!(ids(&seen), ["r-c", "R-0", "r-a", "r-aa", "r-b", "r-y", "r-z"]);
    let unique: BTreeSet<_> = seen.iter().map(|e| (e.occurred_at, e.request_id.clone())).collect();
    assert_eq!(unique.len(), seen.len());
    assert!(seen.iter().all(|e| e.account_id == "a" && e.credential_id == c && e.units == 1));

    // The full export from scratch sees the early event too.
    assert_eq!(export_all(&s, "a", B - 3, B + 99, 3).await.len(), 8);
    assert_eq!(export_all(&s, "a", B - 3, B + 99, 1000).await.len(), 8);

    for (account, other_range) in [("b", range), ("a", Range::new(ts(B - 3), ts(B + 100)).unwrap())] {
        let refused = ExportQuery::new(account, other_range, Some(&cursor), limit);
        assert!(matches!(refused, Err(Error::InvalidCursor)), "{account}");
    }
    assert!(matches!(ExportQuery::new("a", range, Some("c1.garbage"), limit), Err(Error::InvalidCursor)));
}

/// An hour boundary (1 700 002 800 s since the epoch).
const H0: i128 = 1_700_002_800_000_000_000;

/// "A usage query's answer is its events' whatever a store keeps": whole
/// hours and the partial hours at a range's ends add up as the events do,
/// for every window and grouping, across batches that add to the same
/// hour, credential, funding and dimensions; duplicates, rejected events
/// and other accounts' events never count. (PostgreSQL reads whole hours
/// from its hourly totals, `UsageQuery::hourly_plan`.)
pub async fn usage_totals_are_the_events_across_whole_and_partial_hours<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 100), ("b", 0)]).await;
    let now = ts(T0);
    let (c1, c2, cb) = (credential(&s, "a", now).await, credential(&s, "a", now).await, credential(&s, "b", now).await);
    let lease = s.acquire("a", 50, secs(60), now).await.unwrap();
    let x = [("model", "x")];
    let first = vec![
        overage("before", "a", &c1, 1, ts(H0 - 1)),
        with(leased("h0-a", &c1, &lease, 2, ts(H0)), &x),
        with(overage("h0-b", "a", &c2, 4, ts(H0 + 30 * MINUTE)), &[("model", "y")]),
        overage("other", "b", &cb, 1_000, ts(H0 + 1)),
    ];
    assert!(ingest_codes(&s, first, now).await.iter().all(|code| code.ends_with(":accepted")));
    let second = vec![
        with(leased("h0-c", &c1, &lease, 8, ts(H0 + HOUR - 1)), &x),
        overage("h1", "a", &c1, 16, ts(H0 + HOUR + 5)),
        overage("h2", "a", &c2, 32, ts(H0 + 2 * HOUR + 10)),
        with(leased("h0-a", &c1, &lease, 1_000, ts(H0)), &x),
        with(overage("bad", "a", &c1, 64, ts(H0)), &[("Model", "x")]),
    ];
    let codes = ingest_codes(&s, second, now).await;
    assert_eq!(
        codes,
        ["h0-c:accepted", "h1:accepted", "h2:accepted", "h0-a:duplicate", "bad:rejected:invalid_dimensions"]
    );

    let usage = |from: i128, to: i128, window: Option<Window>, group_by: GroupBy| {
        let s = &s;
        async move { buckets(&s.usage("a", &query(from, to, window, group_by)).await.unwrap()) }
    };
    // Whole hours only.
    let hours = usage(H0, H0 + 3 * HOUR, Some(Window::Hour), GroupBy::Nothing).await;
    let expected: Buckets = vec![
        (H0, H0 + HOUR, vec![one(None, 14, 3)]),
        (H0 + HOUR, H0 + 2 * HOUR, vec![one(None, 16, 1)]),
        (H0 + 2 * HOUR, H0 + 3 * HOUR, vec![one(None, 32, 1)]),
    ];
    assert_eq!(hours, expected);
    // Partial ends: from just before the boundary to inside the last hour.
    let cut = usage(H0 - 1, H0 + 2 * HOUR + 10, None, GroupBy::Nothing).await;
    assert_eq!(cut, vec![(H0 - 1, H0 + 2 * HOUR + 10, vec![one(None, 31, 5)])]);
    let cut_hours = usage(H0 + 1, H0 + 2 * HOUR + 11, Some(Window::Hour), GroupBy::Funding).await;
    let expected: Buckets = vec![
        (H0 + 1, H0 + HOUR, vec![one(Some("leased"), 8, 1), one(Some("overage"), 4, 1)]),
        (H0 + HOUR, H0 + 2 * HOUR, vec![one(Some("overage"), 16, 1)]),
        (H0 + 2 * HOUR, H0 + 2 * HOUR + 11, vec![one(Some("overage"), 32, 1)]),
    ];
    assert_eq!(cut_hours, expected);
    // By day, by credential and by dimension over the same hours.
    // H0's day ends an hour after H0.
    let day_start = H0.div_euclid(DAY) * DAY;
    assert_eq!(day_start + DAY, H0 + HOUR);
    let days = usage(day_start, day_start + 2 * DAY, Some(Window::Day), GroupBy::Credential).await;
    let sorted = |mut groups: Vec<_>| {
        groups.sort();
        groups
    };
    let expected: Buckets = vec![
        (day_start, day_start + DAY, sorted(vec![one(Some(&c1), 11, 3), one(Some(&c2), 4, 1)])),
        (day_start + DAY, day_start + 2 * DAY, sorted(vec![one(Some(&c1), 16, 1), one(Some(&c2), 32, 1)])),
    ];
    assert_eq!(days, expected);
    let models = usage(H0 - HOUR, H0 + 3 * HOUR, None, GroupBy::Dimension("model".into())).await;
    let expected = vec![one(None, 49, 3), one(Some("x"), 10, 2), one(Some("y"), 4, 1)];
    assert_eq!(models, vec![(H0 - HOUR, H0 + 3 * HOUR, expected)]);
    // By lease, which hourly totals do not resolve.
    let leases = usage(H0 - HOUR, H0 + 3 * HOUR, None, GroupBy::Lease).await;
    let expected = vec![one(None, 53, 4), one(Some(&lease.lease.lease_id), 10, 2)];
    assert_eq!(leases, vec![(H0 - HOUR, H0 + 3 * HOUR, expected)]);
    let ledger = ledger! { credited: 100, available: 50, reserved: 50, overage: 53, billed: 63, next_fence: 2, active_leases: 1 };
    assert_ledger(&s, "a", ledger).await;
}
