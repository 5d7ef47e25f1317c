//! The statements of usage queries and exports. Each reads one account's
//! events in `[from, to)`, comparing `(floor_us, submicro_ns)` pairs, which
//! order as the instants do, through the index
//! `tollgate_usage_events_occurred` (migration 0021); the totals read whole
//! hours from the hourly totals (migration 0025) instead.

/// The range test of the export's statements: $1 the account, ($2, $3)
/// `from` and ($4, $5) `to` as instant pairs.
macro_rules! in_range {
    () => {
        "u.account_id = $1 \
         AND (u.occurred_at_floor_us, u.occurred_at_submicro_ns) >= ($2::int8, $3::int2) \
         AND (u.occurred_at_floor_us, u.occurred_at_submicro_ns) < ($4::int8, $5::int2)"
    };
}

/// Plans the rest of the transaction's statements for their bound values.
/// The pool's connections plan generically (`connect_pool` says why), which
/// suits every keyed statement; the usage totals are the exception: whether
/// an index range or a sequential scan is cheaper depends on how much of the
/// table the account and range are, which only the values tell.
pub(in crate::store) const CUSTOM_PLANS_SQL: &str = "SET LOCAL plan_cache_mode = force_custom_plan";

/// The bucket of the instant whose microseconds are `$x`, for the window of
/// $10 in microseconds (NULL for the whole range: bucket 0):
/// `floor($x / $10)`, floor division written with `%` (which truncates) so
/// that it holds before 1970 too.
macro_rules! bucket_of {
    ($x:expr) => {
        concat!(
            "CASE WHEN $10::int8 IS NULL THEN 0::int8 ELSE (",
            $x,
            " - (",
            $x,
            " % $10::int8 + $10::int8) % $10::int8) / $10::int8 END"
        )
    };
}

/// The group key, for the grouping named by $11 (`credential`, `lease`,
/// `funding`, `dimension`, or anything else for none) and the dimension key
/// $12, from a row's credential, lease, funding and dimensions expressions;
/// a NULL key is the group of events without one.
macro_rules! group_key {
    ($credential:expr, $lease:expr, $leased:expr, $dimensions:expr) => {
        concat!(
            "CASE $11::text WHEN 'credential' THEN ",
            $credential,
            " WHEN 'lease' THEN ",
            $lease,
            " WHEN 'funding' THEN CASE WHEN ",
            $leased,
            " THEN 'leased' ELSE 'overage' END WHEN 'dimension' THEN ",
            $dimensions,
            " ->> $12::text END"
        )
    };
}

/// The account's events in `[($a, $b), ($c, $d))`, one row per event.
macro_rules! events_part {
    ($a:literal, $b:literal, $c:literal, $d:literal) => {
        concat!(
            "SELECT ",
            bucket_of!("u.occurred_at_floor_us"),
            " AS bucket, ",
            group_key!("u.credential_id", "u.lease_id", "u.lease_id IS NOT NULL", "u.dimensions"),
            " AS group_key, u.units::numeric AS units, 1::int8 AS events
    FROM tollgate_usage_events u
    WHERE $",
            $a,
            "::int8 IS NOT NULL AND u.account_id = $1
      AND (u.occurred_at_floor_us, u.occurred_at_submicro_ns) >= ($",
            $a,
            "::int8, $",
            $b,
            "::int2)
      AND (u.occurred_at_floor_us, u.occurred_at_submicro_ns) < ($",
            $c,
            "::int8, $",
            $d,
            "::int2)"
        )
    };
}

/// The hourly totals (migration 0025) of the account $1's whole hours
/// `$13 <= hour < $14`, each in the bucket of its hour's start; none when $13
/// is NULL.
macro_rules! hours_part {
    () => {
        concat!(
            "SELECT ",
            bucket_of!("(h.hour * 3600000000)"),
            " AS bucket, ",
            group_key!("h.credential_id", "NULL::text", "h.leased", "h.dimensions"),
            " AS group_key, h.units, h.events
    FROM tollgate_usage_hourly h
    WHERE $13::int8 IS NOT NULL AND h.account_id = $1 AND h.hour >= $13::int8 AND h.hour < $14::int8"
        )
    };
}

/// Units and event counts of the account $1 in a query's range by bucket
/// and group, as decimal text (sums are `numeric`: they never wrap), read
/// as the core's `HourlyPlan` says: the events of its head
/// `[($2, $3), ($4, $5))` and its tail `[($6, $7), ($8, $9))`, instants as
/// `(floor_us, submicro_ns)` pairs, and the hourly totals of its whole hours
/// (`hours_part!`); a part that is empty has NULL bounds ($2, $6 or $13
/// NULL) and reads nothing. One statement, so one snapshot: an event
/// committed meanwhile is in all three parts or in none. Planned for its
/// values (`CUSTOM_PLANS_SQL`).
pub(in crate::store) const USAGE_TOTALS_SQL: &str = concat!(
    "SELECT g.bucket, g.group_key, sum(g.units)::text, sum(g.events)::text FROM (
    ",
    events_part!("2", "3", "4", "5"),
    "
    UNION ALL
    ",
    events_part!("6", "7", "8", "9"),
    "
    UNION ALL
    ",
    hours_part!(),
    "
) g GROUP BY g.bucket, g.group_key"
);

/// `USAGE_TOTALS_SQL` for a query of whole hours, whose event parts are
/// empty: the hourly totals alone, with the same parameters ($2 to $9 unused).
/// Its generic plan is an index range of `tollgate_usage_hourly_pkey`, where
/// `USAGE_TOTALS_SQL`'s, which cannot know its event parts are empty, plans
/// for them as reads of many events (a parallel plan whose start-up was most
/// of a page's query).
pub(in crate::store) const USAGE_HOURS_SQL: &str = concat!(
    "SELECT g.bucket, g.group_key, sum(g.units)::text, sum(g.events)::text FROM (
    ",
    hours_part!(),
    "
) g GROUP BY g.bucket, g.group_key"
);

/// The columns of an exported event.
macro_rules! exported_columns {
    () => {
        "u.request_id, u.credential_id, u.units, u.occurred_at_floor_us, u.occurred_at_submicro_ns, \
         u.lease_id, u.fencing_token, u.dimensions::text"
    };
}

/// The first page of the account's events in the range: at most $6 rows in
/// `(occurred_at, request_id)` order, request ids byte by byte.
pub(in crate::store) const USAGE_EVENTS_FIRST_SQL: &str = concat!(
    "SELECT ",
    exported_columns!(),
    " FROM tollgate_usage_events u WHERE ",
    in_range!(),
    " ORDER BY u.occurred_at_floor_us, u.occurred_at_submicro_ns, u.request_id COLLATE \"C\" LIMIT $6"
);

/// A later page: as the first, strictly after the event ($6, $7, $8) that
/// ended the previous one, at most $9 rows.
pub(in crate::store) const USAGE_EVENTS_AFTER_SQL: &str = concat!(
    "SELECT ",
    exported_columns!(),
    " FROM tollgate_usage_events u WHERE ",
    in_range!(),
    " AND (u.occurred_at_floor_us, u.occurred_at_submicro_ns, u.request_id COLLATE \"C\") > ($6::int8, $7::int2, $8::text)",
    " ORDER BY u.occurred_at_floor_us, u.occurred_at_submicro_ns, u.request_id COLLATE \"C\" LIMIT $9"
);
