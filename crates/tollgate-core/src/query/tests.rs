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

const HOUR: i128 = 60 * MINUTE;

fn query(from: i128, to: i128, window: Option<Window>, group_by: GroupBy) -> UsageQuery {
    UsageQuery::new(Range::new(at(from), at(to)).unwrap(), window, group_by).unwrap()
}

#[test]
fn an_hourly_plan_reads_whole_hours_from_totals_and_the_partial_ends_from_events() {
    let aligned = query(0, 2 * HOUR, Some(Window::Hour), GroupBy::Credential).hourly_plan();
    assert_eq!(aligned, HourlyPlan { head: (at(0), at(0)), hours: (0, 2), tail: (at(2 * HOUR), at(2 * HOUR)) });
    let cut = query(-30 * MINUTE, 2 * HOUR + 1, None, GroupBy::Nothing).hourly_plan();
    assert_eq!(
        cut,
        HourlyPlan { head: (at(-30 * MINUTE), at(0)), hours: (0, 2), tail: (at(2 * HOUR), at(2 * HOUR + 1)) }
    );
    let before_1970 = query(-3 * HOUR - 1, -HOUR + 1, Some(Window::Day), GroupBy::Funding).hourly_plan();
    assert_eq!(before_1970.hours, (-3, -1));
    let events_only = |q: UsageQuery| {
        let plan = q.hourly_plan();
        assert_eq!(
            plan,
            HourlyPlan { head: (q.range.from, q.range.to), hours: (0, 0), tail: (q.range.to, q.range.to) }
        );
    };
    events_only(query(30 * MINUTE, 90 * MINUTE, Some(Window::Hour), GroupBy::Nothing));
    events_only(query(0, 2 * HOUR, Some(Window::Minute), GroupBy::Nothing));
    events_only(query(0, 2 * HOUR, Some(Window::Hour), GroupBy::Lease));
}

/// The report of a plan: the events of its two ends as they are, and those
/// of its whole hours as hourly totals would give them, each added to the
/// bucket of its hour's start.
fn planned_report(q: &UsageQuery, events: &[UsageEvent]) -> UsageReport {
    let plan = q.hourly_plan();
    let mut aggregation = Aggregation::new(q);
    for e in events {
        let ns = e.occurred_at.as_nanosecond();
        let hour = ns.div_euclid(HOUR) as i64;
        let in_part = |(from, to): (Timestamp, Timestamp)| from <= e.occurred_at && e.occurred_at < to;
        if in_part(plan.head) || in_part(plan.tail) {
            aggregation.add_event(e).unwrap();
        } else if (plan.hours.0..plan.hours.1).contains(&hour) {
            let bucket = q.bucket_of(at(i128::from(hour) * HOUR));
            aggregation.add(bucket, q.group_by.key_of(e), u128::from(e.units), 1).unwrap();
        }
    }
    aggregation.finish().unwrap()
}

proptest::proptest! {
    #[test]
    fn an_hourly_plan_answers_as_the_events_do(
        times in proptest::collection::vec((-5 * HOUR..5 * HOUR, 0u64..100, proptest::bool::ANY, 0u8..3), 0..40),
        from in -6 * HOUR..6 * HOUR,
        length in 1..8 * HOUR,
        window in 0usize..4,
        group in 0usize..5,
    ) {
        let events: Vec<UsageEvent> = times
            .iter()
            .enumerate()
            .map(|(i, (ns, units, leased, model))| {
                let model = ["x", "y"].get(usize::from(*model)).copied();
                event(&format!("r{i}"), *ns, *units, leased.then_some("l"), model)
            })
            .collect();
        let window = [None, Some(Window::Minute), Some(Window::Hour), Some(Window::Day)][window];
        let group_by =
            [GroupBy::Nothing, GroupBy::Credential, GroupBy::Lease, GroupBy::Funding, GroupBy::Dimension("model".into())]
                [group]
                .clone();
        let q = query(from, from + length, window, group_by);
        let mut all = Aggregation::new(&q);
        for e in &events {
            all.add_event(e).unwrap();
        }
        proptest::prop_assert_eq!(planned_report(&q, &events), all.finish().unwrap());
    }
}
