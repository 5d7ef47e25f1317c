//! Row types and their decoding into the core's types. The columns each row
//! reads are the lists in `sql`; a value the core's types cannot hold is
//! `storage_corrupt`, never a default.

use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};
use tollgate_core::ledger::LeaseState;
use tollgate_core::{Account, COUNTER_NAMES, COUNTERS, Credential, Error, InstantPair, Lease, SecretHash};

use super::errors::{corrupt, db_i64};
use super::sql::WRITTEN_COUNTER_NAMES;

/// An account row: its id and its counters in `COUNTER_NAMES` order, as
/// stored. Read by the static column names of `COUNTER_NAMES`, so decoding a
/// row allocates nothing but its id.
pub(super) struct AccountRow {
    pub(super) account_id: String,
    pub(super) counters: [i64; COUNTERS],
}

impl<'r> FromRow<'r, PgRow> for AccountRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self { account_id: row.try_get("account_id")?, counters: read_counters(row, &COUNTER_NAMES)? })
    }
}

/// The counters under `names`, in `COUNTER_NAMES` order.
fn read_counters(row: &PgRow, names: &[&'static str; COUNTERS]) -> Result<[i64; COUNTERS], sqlx::Error> {
    let mut counters = [0; COUNTERS];
    for (counter, name) in counters.iter_mut().zip(names) {
        *counter = row.try_get(*name)?;
    }
    Ok(counters)
}

impl AccountRow {
    pub(super) fn decode(self) -> Result<Account, Error> {
        let mut counters = [0; COUNTERS];
        for ((counter, value), name) in counters.iter_mut().zip(self.counters).zip(COUNTER_NAMES) {
            *counter =
                u64::try_from(value).map_err(|_| corrupt(format!("account {}: {name} is {value}", self.account_id)))?;
        }
        let account = Account::with_counters(self.account_id, counters);
        if account.next_fence == 0 {
            return Err(corrupt(format!("account {}: next_fence is 0", account.account_id)));
        }
        Ok(account)
    }
}

/// The seven account counters, in `COUNTER_NAMES` order, as `BIGINT` values.
pub(super) fn counters(account: &Account) -> Result<[i64; COUNTERS], Error> {
    let mut values = [0; COUNTERS];
    for ((value, counter), name) in values.iter_mut().zip(account.counters()).zip(COUNTER_NAMES) {
        *value = db_i64(counter, name)?;
    }
    Ok(values)
}

/// The core's change to an account, counter by counter (`after - before`).
/// Both sides are within `BIGINT`, so no difference overflows.
pub(super) fn difference(before: &Account, after: &Account) -> Result<[i64; COUNTERS], Error> {
    let (before, after) = (counters(before)?, counters(after)?);
    Ok(std::array::from_fn(|i| after[i] - before[i]))
}

#[derive(FromRow)]
pub(super) struct LeaseRow {
    pub(super) lease_id: String,
    pub(super) lease_account_id: String,
    pub(super) fencing_token: i64,
    pub(super) capability_hash: Vec<u8>,
    pub(super) granted: i64,
    pub(super) used: i64,
    pub(super) state: String,
    pub(super) expiry_floor_us: i64,
    pub(super) expiry_submicro_ns: i16,
    pub(super) expiry_is_upper_bound: bool,
}

/// A lease with the hash of its capability, which only stores see.
pub(super) struct LeaseRecord {
    pub(super) lease: Lease,
    pub(super) capability: SecretHash,
}

impl LeaseRow {
    pub(super) fn decode(self) -> Result<LeaseRecord, Error> {
        let id = &self.lease_id;
        let bad = |what: String| corrupt(format!("lease {id}: {what}"));
        if self.fencing_token <= 0 {
            return Err(bad(format!("fencing_token is {}", self.fencing_token)));
        }
        let fencing_token = self.fencing_token.unsigned_abs();
        let granted = u64::try_from(self.granted).map_err(|_| bad(format!("granted is {}", self.granted)))?;
        let used = u64::try_from(self.used).map_err(|_| bad(format!("used is {}", self.used)))?;
        let state = LeaseState::parse(&self.state).ok_or_else(|| bad(format!("state is {:?}", self.state)))?;
        let expiry = InstantPair::decode(self.expiry_floor_us, i64::from(self.expiry_submicro_ns))
            .map_err(|e| bad(format!("expiry: {e}")))?;
        let capability = SecretHash::from_slice(&self.capability_hash)
            .ok_or_else(|| bad(format!("capability_hash has {} bytes", self.capability_hash.len())))?;
        Ok(LeaseRecord {
            lease: Lease {
                lease_id: self.lease_id,
                account_id: self.lease_account_id,
                fencing_token,
                granted,
                used,
                state,
                expiry,
                expiry_is_upper_bound: self.expiry_is_upper_bound,
            },
            capability,
        })
    }
}

#[derive(FromRow)]
pub(super) struct HeldLeaseRow {
    #[sqlx(flatten)]
    pub(super) account: AccountRow,
    #[sqlx(flatten)]
    pub(super) lease: LeaseRow,
}

/// A row of `READ_DUE_SQL`: a due lease with its account, and how many of
/// the most overdue leases the statement looked at to choose the accounts.
#[derive(FromRow)]
pub(super) struct DueRow {
    pub(super) considered: i64,
    #[sqlx(flatten)]
    pub(super) held: HeldLeaseRow,
}

#[derive(FromRow)]
pub(super) struct CredentialRow {
    pub(super) credential_id: String,
    pub(super) credential_account_id: String,
    pub(super) label: String,
    pub(super) key_hash: Vec<u8>,
    pub(super) created_floor_us: i64,
    pub(super) created_submicro_ns: i16,
    pub(super) revoked_floor_us: Option<i64>,
    pub(super) revoked_submicro_ns: Option<i16>,
    pub(super) last_used_floor_us: Option<i64>,
    pub(super) last_used_submicro_ns: Option<i16>,
    pub(super) accepted_events: i64,
    pub(super) accepted_units: i64,
}

pub(super) struct CredentialRecord {
    pub(super) credential: Credential,
    pub(super) key: SecretHash,
}

impl CredentialRow {
    pub(super) fn decode(self) -> Result<CredentialRecord, Error> {
        let id = &self.credential_id;
        let bad = |what: String| corrupt(format!("credential {id}: {what}"));
        let instant = |name: &str, floor_us: i64, submicro_ns: i16| {
            InstantPair::decode(floor_us, i64::from(submicro_ns)).map_err(|e| bad(format!("{name}: {e}")))
        };
        let optional = |name: &str, floor_us: Option<i64>, submicro_ns: Option<i16>| match (floor_us, submicro_ns) {
            (None, None) => Ok(None),
            (Some(floor_us), Some(submicro_ns)) => instant(name, floor_us, submicro_ns).map(Some),
            _ => Err(bad(format!("{name} has only one of its two columns"))),
        };
        let count = |name: &str, value: i64| u64::try_from(value).map_err(|_| bad(format!("{name} is {value}")));
        let credential = Credential {
            credential_id: String::new(),
            account_id: self.credential_account_id,
            label: self.label,
            created_at: instant("created", self.created_floor_us, self.created_submicro_ns)?,
            revoked_at: optional("revoked", self.revoked_floor_us, self.revoked_submicro_ns)?,
            last_used_at: optional("last_used", self.last_used_floor_us, self.last_used_submicro_ns)?,
            accepted_events: count("accepted_events", self.accepted_events)?,
            accepted_units: count("accepted_units", self.accepted_units)?,
        };
        let key = SecretHash::from_slice(&self.key_hash)
            .ok_or_else(|| bad(format!("key_hash has {} bytes", self.key_hash.len())))?;
        Ok(CredentialRecord { credential: Credential { credential_id: self.credential_id, ..credential }, key })
    }
}

/// What `ACQUIRE_IF_UNCHANGED_SQL` returns.
#[derive(FromRow)]
pub(super) struct WrittenAccountRow {
    pub(super) written: i64,
    #[sqlx(flatten)]
    pub(super) account: AccountRow,
}

/// What `RELEASE_*_IF_UNCHANGED_SQL` return: the account's counters as
/// written (none when nothing was), and the rows as the statement found them.
pub(super) struct WrittenHeldRow {
    pub(super) written: i64,
    written_counters: Option<[i64; COUNTERS]>,
    pub(super) account: AccountRow,
    pub(super) lease: LeaseRow,
}

impl<'r> FromRow<'r, PgRow> for WrittenHeldRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        let written: i64 = row.try_get("written")?;
        // The counters are NULL exactly when the write did not happen.
        let written_counters = match row.try_get::<Option<i64>, _>(WRITTEN_COUNTER_NAMES[0])? {
            Some(_) => Some(read_counters(row, &WRITTEN_COUNTER_NAMES)?),
            None => None,
        };
        Ok(Self { written, written_counters, account: AccountRow::from_row(row)?, lease: LeaseRow::from_row(row)? })
    }
}

impl WrittenHeldRow {
    /// The account as the write left it, when it wrote.
    pub(super) fn written_account(&self) -> Option<Result<Account, Error>> {
        let counters = self.written_counters?;
        Some(AccountRow { account_id: self.account.account_id.clone(), counters }.decode())
    }
}
