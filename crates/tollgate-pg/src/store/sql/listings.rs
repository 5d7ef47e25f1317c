//! The listings' statements: one page of rows in key order strictly after
//! the cursor's key (`$2`, `''` on a first page, which every key follows),
//! `limit + 1` rows at most. The order is the key column's collation, in
//! which both the comparison and the `ORDER BY` are made, so no row is
//! skipped or repeated whatever the collation; on a database created with
//! the C locale (as the test databases are) it is byte order, the memory
//! store's. The per-account listings filter by `account_id = $1`, so on a
//! partitioned schema they read one partition, through the primary key
//! `(account_id, key)`.

/// Accounts whose id starts with `$1` (`''`: every account) after `$2`, with
/// their active lease count.
pub(in crate::store) const LIST_ACCOUNTS_SQL: &str = concat!(
    "SELECT ",
    account_columns!(),
    ", (SELECT count(*) FROM tollgate_leases l \
        WHERE l.account_id = a.account_id AND l.state = 'active') AS active_leases \
     FROM tollgate_accounts a WHERE a.account_id > $2 AND starts_with(a.account_id, $1) \
     ORDER BY a.account_id LIMIT $3"
);

/// The leases of the account `$1` after `$2` whose state is among `$3`.
pub(in crate::store) const LIST_LEASES_SQL: &str = concat!(
    "SELECT ",
    lease_columns!(),
    " FROM tollgate_leases l WHERE l.account_id = $1 AND l.lease_id > $2 AND l.state = ANY($3) \
     ORDER BY l.lease_id LIMIT $4"
);

/// The credentials of the account `$1` after `$2`.
pub(in crate::store) const LIST_CREDENTIALS_SQL: &str = concat!(
    "SELECT ",
    credential_columns!(),
    " FROM tollgate_credentials c WHERE c.account_id = $1 AND c.credential_id > $2 \
     ORDER BY c.credential_id LIMIT $3"
);

/// The credits of the account `$1` after `$2`.
pub(in crate::store) const LIST_CREDITS_SQL: &str = "SELECT c.credit_id, c.units FROM tollgate_credits c \
     WHERE c.account_id = $1 AND c.credit_id > $2 ORDER BY c.credit_id LIMIT $3";
