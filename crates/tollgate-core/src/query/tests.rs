use super::*;
use crate::usage::Dimensions;

fn at(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).unwrap()
}

const MINUTE: i128 = 60_000_000_000;

fn event(request_id: &str, ns: i128, units: u64, lease: Option<&str>, model: Option<&str>) -> UsageEvent {
    UsageEvent {
        request_id: request_id.into(),
        account_id: "a".into(),
        credential_id: "c".into(),
        units,
        occurred_at: at(ns),
        lease_id: lease.map(Into::into),
        fencing_token: lease.map(|_| 1),
        dimensions: model.map(|m| Dimensions::from([("model".to_owned(), m.to_owned())])).unwrap_or_default(),
    }
}

#[test]
fn windows_and_groupings_parse_or_are_typed_errors() {
    assert_eq!(Window::parse(None), Ok(None));
    assert_eq!(Window::parse(Some("PT1H")), Ok(Some(Window::Hour)));
    for bad in ["", "PT1S", "pt1m", "P1W", "PT60M"] {
        assert_eq!(Window::parse(Some(bad)), Err(Error::InvalidWindow), "{bad}");
    }
    assert_eq!(GroupBy::parse(Some("dimension:model")), Ok(GroupBy::Dimension("model".into())));
    assert_eq!(GroupBy::parse(Some("funding")), Ok(GroupBy::Funding));
    for bad in ["", "dimension:", "dimension:Model", "account", "lease "] {
        assert_eq!(GroupBy::parse(Some(bad)), Err(Error::InvalidGroupBy), "{bad}");
    }
    assert_eq!(GroupBy::Dimension("k".into()).code().as_deref(), Some("dimension:k"));
}

#[test]
fn buckets_use_floor_division_before_the_epoch() {
    assert_eq!(Window::Minute.bucket_of(at(0)), 0);
    assert_eq!(Window::Minute.bucket_of(at(-1)), -1);
    assert_eq!(Window::Minute.bucket_of(at(-MINUTE)), -1);
    assert_eq!(Window::Minute.bucket_of(at(-MINUTE - 1)), -2);
    assert_eq!(Window::Minute.bucket_of(at(MINUTE - 1)), 0);
    assert_eq!(Window::Day.bucket_of(Timestamp::MIN), Timestamp::MIN.as_second().div_euclid(86_400));
    let micros = |t: Timestamp| t.as_nanosecond().div_euclid(1_000) as i64;
    for ns in [-MINUTE - 1, -1, 0, 1, 3 * MINUTE + 999] {
        assert_eq!(Window::Minute.bucket_of(at(ns)), micros(at(ns)).div_euclid(Window::Minute.micros()));
    }
}

#[test]
fn bucket_count_includes_partial_windows_and_is_bounded() {
    let query =
        |from: i128, to: i128, window| UsageQuery::new(Range::new(at(from), at(to)).unwrap(), window, GroupBy::Nothing);
    assert_eq!(query(0, MINUTE, Some(Window::Minute)).unwrap().bucket_count(), 1);
    assert_eq!(query(0, MINUTE + 1, Some(Window::Minute)).unwrap().bucket_count(), 2);
    assert_eq!(query(-1, 1, Some(Window::Minute)).unwrap().bucket_count(), 2);
    assert_eq!(query(0, 10_000 * MINUTE, Some(Window::Minute)).unwrap().bucket_count(), 10_000);
    assert_eq!(
        query(-1, 10_000 * MINUTE - 1, Some(Window::Minute)),
        Err(Error::TooManyBuckets { buckets: 10_001, max: BUCKETS_MAX })
    );
    let whole = UsageQuery::new(Range::new(Timestamp::MIN, Timestamp::MAX).unwrap(), None, GroupBy::Nothing).unwrap();
    assert_eq!(whole.bucket_count(), 1);
    assert!(matches!(
        UsageQuery::new(Range::new(Timestamp::MIN, Timestamp::MAX).unwrap(), Some(Window::Day), GroupBy::Nothing),
        Err(Error::TooManyBuckets { .. })
    ));
    assert_eq!(Range::new(at(1), at(1)), Err(Error::InvalidRange));
    assert_eq!(Range::new(at(2), at(1)), Err(Error::InvalidRange));
}

#[test]
fn parse_checks_fields_in_order() {
    let p = |from, to, window, group| UsageQuery::parse(from, to, window, group).map(|_| ());
    assert_eq!(p(None, Some("2026-01-01T00:00:00Z"), None, None), Err(Error::InvalidTimestamp { field: "from" }));
    assert_eq!(
        p(Some("2026-01-01T00:00:00Z"), Some("yesterday"), None, None),
        Err(Error::InvalidTimestamp { field: "to" })
    );
    assert_eq!(
        p(Some("2026-01-01T00:00:00.1234567891Z"), Some("2026-01-02T00:00:00Z"), None, None),
        Err(Error::InvalidTimestamp { field: "from" })
    );
    assert_eq!(p(Some("2026-01-02T00:00:00Z"), Some("2026-01-01T00:00:00Z"), None, None), Err(Error::InvalidRange));
    assert_eq!(
        p(Some("1969-12-31T23:59:59.999999999Z"), Some("1970-01-01T00:00:00Z"), Some("P1D"), Some("lease")),
        Ok(())
    );
}

#[test]
fn aggregation_tiles_the_range_and_groups() {
    let range = Range::new(at(-MINUTE / 2), at(2 * MINUTE)).unwrap();
    let query = UsageQuery::new(range, Some(Window::Minute), GroupBy::Dimension("model".into())).unwrap();
    let events = [
        event("a", -MINUTE / 2, 1, None, Some("x")),
        event("b", -1, 2, Some("l"), None),
        event("c", 0, 4, None, Some("x")),
        event("d", MINUTE - 1, 8, None, Some("y")),
        event("e", 2 * MINUTE, 16, None, Some("x")),
        event("f", -MINUTE / 2 - 1, 32, None, Some("x")),
    ];
    let mut aggregation = Aggregation::new(&query);
    for e in &events {
        aggregation.add_event(e).unwrap();
    }
    let report = aggregation.finish().unwrap();
    let spans: Vec<_> = report.buckets.iter().map(|b| (b.start, b.end)).collect();
    assert_eq!(spans, [(at(-MINUTE / 2), at(0)), (at(0), at(MINUTE)), (at(MINUTE), at(2 * MINUTE))]);
    let groups = |i: usize| -> Vec<(Option<&str>, u128, u128)> {
        report.buckets[i].groups.iter().map(|g| (g.key.as_deref(), g.totals.units, g.totals.events)).collect()
    };
    assert_eq!(groups(0), [(None, 2, 1), (Some("x"), 1, 1)]);
    assert_eq!(groups(1), [(Some("x"), 4, 1), (Some("y"), 8, 1)]);
    assert_eq!(groups(2), []);
    assert_eq!(report.total, Totals { units: 15, events: 4 });
    let mut stray = Aggregation::new(&query);
    assert!(matches!(stray.add(2, None, 1, 1), Err(Error::StorageCorrupt(_))));
}

#[test]
fn groupings_key_events() {
    let leased = event("a", 0, 1, Some("l"), Some("x"));
    let overage = event("b", 0, 1, None, None);
    assert_eq!(GroupBy::Lease.key_of(&leased).as_deref(), Some("l"));
    assert_eq!(GroupBy::Lease.key_of(&overage), None);
    assert_eq!(GroupBy::Funding.key_of(&leased).as_deref(), Some("leased"));
    assert_eq!(GroupBy::Funding.key_of(&overage).as_deref(), Some("overage"));
    assert_eq!(GroupBy::Credential.key_of(&overage).as_deref(), Some("c"));
    assert_eq!(GroupBy::Nothing.key_of(&leased), None);
}

#[test]
fn export_cursors_resume_their_own_account_and_range() {
    let q =
        ExportQuery::parse("a", Some("1970-01-01T00:00:00Z"), Some("1970-01-02T00:00:00Z"), None, limit(1)).unwrap();
    let page = q.page(vec![event("r1", 5, 1, None, None), event("r2", 5, 1, None, None)]);
    assert_eq!(page.items.len(), 1);
    let cursor = page.next_cursor.unwrap();
    let next = q.resume("a", &cursor).unwrap();
    assert_eq!(next.after, Some((at(5), "r1".to_owned())));
    assert!(next.admits(at(5), "r2") && !next.admits(at(5), "r1") && next.admits(at(6), "a"));
    assert!(matches!(q.resume("b", &cursor), Err(Error::InvalidCursor)));
    let other =
        ExportQuery::parse("a", Some("1970-01-01T00:00:00Z"), Some("1970-01-03T00:00:00Z"), Some(&cursor), limit(100));
    assert!(matches!(other, Err(Error::InvalidCursor)));
}

fn limit(rows: u32) -> PageLimit {
    PageLimit::new(Some(rows)).unwrap()
}
