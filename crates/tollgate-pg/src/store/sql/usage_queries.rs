//! The statements of usage queries and exports. Each reads one account's
//! events in `[from, to)`, comparing `(floor_us, submicro_ns)` pairs, which
//! order as the instants do; both are served by the index
//! `tollgate_usage_events_occurred` (migration 0021).

/// The range test of both statements: $1 the account, ($2, $3) `from` and
/// ($4, $5) `to` as instant pairs.
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

/// Units and event counts of the account's events in the range, by bucket
/// and group, as decimal text (`sum` of `BIGINT` is `numeric`: it never
/// wraps). $6 is the window in microseconds, NULL for the whole range (every
/// event in bucket 0); the bucket is `floor(floor_us / $6)`, floor division
/// written with `%` (which truncates) so that it holds before 1970 too. $7
/// names the grouping (`credential`, `lease`, `funding`, `dimension`, or
/// anything else for none) and $8 the dimension's key; a NULL group is the
/// events without a key.
pub(in crate::store) const USAGE_TOTALS_SQL: &str = concat!(
    "SELECT g.bucket, g.group_key, sum(g.units)::text, count(*)::text FROM (
    SELECT CASE WHEN $6::int8 IS NULL THEN 0::int8
                ELSE (u.occurred_at_floor_us - (u.occurred_at_floor_us % $6::int8 + $6::int8) % $6::int8) / $6::int8
           END AS bucket,
           CASE $7::text
                WHEN 'credential' THEN u.credential_id
                WHEN 'lease' THEN u.lease_id
                WHEN 'funding' THEN CASE WHEN u.lease_id IS NULL THEN 'overage' ELSE 'leased' END
                WHEN 'dimension' THEN u.dimensions ->> $8::text
           END AS group_key,
           u.units
    FROM tollgate_usage_events u
    WHERE ",
    in_range!(),
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
