//! `PostgresStore`: the store contract over PostgreSQL.
//!
//! Like `MemoryStore`, every operation loads the state it needs, hands it to the
//! same `tollgate-core` functions, and persists what they decided; the two
//! stores differ only in how they load and persist. Here there are two ways:
//!
//! - the locking path: a locking read and one write statement inside one
//!   transaction per operation;
//! - the unlocked path (`unlocked`), which acquire, release and reclaim try
//!   first: the core decides on the rows as this server last wrote them, or
//!   as a plain read returns them, and one autocommitted write applies the
//!   decision only if the rows it depended on are unchanged, falling back to
//!   the locking path when they keep changing.
//!
//! Locks are taken in one global order so that no two operations can wait on
//! each other in a cycle: a keyed request's idempotency key row first
//! (`idempotency`), then account rows (in `account_id` order), then lease rows
//! (in `lease_id` order), then credential rows. Every write to a lease happens
//! under its account's lock, and no lease is locked without it: ingestion and
//! consolidation lock only the leases of accounts they hold. The locking reclaim pass is the
//! exception that proves the rule: it finds due leases with `FOR UPDATE SKIP
//! LOCKED` and then takes their accounts with `SKIP LOCKED` as well, so it
//! never waits at all; a lease whose account is busy stays due for the next
//! pass.
//!
//! Reads that depend on a lock come in a statement *after* the one that took
//! it: under READ COMMITTED each statement sees everything committed before it
//! began, while a statement that waited for a row lock re-reads only the locked
//! rows, not its joins or subqueries.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{FromRow, PgConnection, PgPool};
use tollgate_core::ids::validate_label;
use tollgate_core::ledger::{self, LeaseState};
use tollgate_core::usage::{self, UsageSnapshot};
use tollgate_core::{
    Account, BATCH_EVENTS_MAX, Credential, Error, EventOutcome, GrantPolicy, IngestError, InstantPair, Lease,
    SecretHash, UnitDomain, UsageEvent, check_conservation, validate_id,
};
use tollgate_store::{
    AccountView, CheckReport, Consolidated, CreditReceipt, GuardViolation, Idempotency, IssuedCredential, IssuedLease,
    LeaseHandle, LegacyBoundCount, MigrationStatus, ReclaimReport, ReclaimedLease, Released, Request, StorageStatus,
    Store, UsageSink, Verification, new_capability, new_credential_id, new_credential_key, new_lease_id,
    reclaim_read_max,
};

use crate::inspect;
use crate::migrations::{self, AppliedMigration, MigrationError};

/// PostgreSQL's unit domain: nonnegative `BIGINT`.
const DOMAIN: UnitDomain = UnitDomain::I64;

/// The settings row that pins the reclaim grace shared by every server, as an
/// ISO 8601 duration (exact to the nanosecond).
const RECLAIM_GRACE_SETTING: &str = "reclaim_grace";

/// Statements `pin_reclaim_grace` runs before giving up: the second one
/// always sees a row another server's concurrent insert committed.
const PIN_ATTEMPTS_MAX: u32 = 2;

/// Accounts per page in `check`, which bounds its memory.
const CHECK_PAGE_ACCOUNTS: i64 = 1_000;

/// Pool settings for `PostgresStore::connect_with`.
#[derive(Debug, Clone)]
pub struct PgStoreConfig {
    pub connections_max: u32,
    /// How long an operation waits for a pooled connection.
    pub acquire_timeout: Duration,
    /// How long one statement waits for a row lock before it fails, having
    /// changed nothing, as retryable `storage_unavailable` (PostgreSQL's
    /// `lock_timeout`; `None` waits without bound). A server sets both waits
    /// below its request timeout, so that a write never waits for a lock past
    /// the moment its caller was answered.
    pub lock_timeout: Option<Duration>,
}

impl Default for PgStoreConfig {
    fn default() -> Self {
        Self { connections_max: 16, acquire_timeout: Duration::from_secs(10), lock_timeout: None }
    }
}

/// Opens a pool with the settings every `PostgresStore` pool has.
///
/// No ping before each use (sqlx's `test_before_acquire`): it would cost every
/// operation a round trip. A connection that broke while idle fails the one
/// operation that next uses it, as `storage_unavailable` (retryable, nothing
/// applied), and the pool drops it.
///
/// Each connection starts with `plan_cache_mode = force_generic_plan`, sent in
/// the startup packet (no round trip): each statement here has one fixed
/// shape, keyed by primary keys or by `unnest` of parameter arrays, so its
/// plan does not depend on the values bound. PostgreSQL's default re-plans a
/// prepared statement for its values on each of its first executions and
/// keeps doing so when the generic plan's estimate looks no cheaper, which for
/// the array statements it never does; on the lease cycle that planning cost
/// about as much as executing the write (`bench/ANALYSIS.md`).
pub async fn connect_pool(
    options: PgConnectOptions,
    connections_max: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(connections_max)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .connect_with(options.options([("plan_cache_mode", "force_generic_plan")]))
        .await
}

/// Why a `PostgresStore` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot reach PostgreSQL: {0}")]
    Unavailable(#[source] sqlx::Error),
    #[error(transparent)]
    Migration(#[from] MigrationError),
}

/// The PostgreSQL-backed store.
///
/// Every operation runs to completion in a task of its own (`complete`): a
/// caller that goes away (a client that hangs up, a request timeout, a
/// dropped future) stops waiting for the answer, never the operation. Cheap
/// to clone; clones share the pool and the remembered rows.
#[derive(Clone)]
pub struct PostgresStore {
    engine: Arc<Engine>,
    running: complete::Running,
    /// Whether operations run in tasks of their own; always, except for
    /// tests of the layer beneath (`inline`).
    tasks: bool,
}

/// The operations themselves, which `PostgresStore` runs to completion.
pub(crate) struct Engine {
    pool: PgPool,
    policy: GrantPolicy,
    /// Rows as this server last wrote them: the unlocked path's first guess.
    guesses: unlocked::Guesses,
    applied: Vec<AppliedMigration>,
    /// The test database this store lives in, dropped with the store.
    #[cfg(feature = "testing")]
    _test_db: Option<crate::testing::TestDb>,
}

impl PostgresStore {
    /// Connects with default pool settings; see `connect_with`.
    pub async fn connect(url: &str, policy: GrantPolicy) -> Result<Self, ConnectError> {
        Self::connect_with(url, policy, PgStoreConfig::default()).await
    }

    /// Connects and applies the embedded migrations after sqlx's validation of
    /// the applied history: a database holding a version this binary does not
    /// know is refused before anything is served. Servers then call
    /// `Store::pin_reclaim_grace`.
    pub async fn connect_with(url: &str, policy: GrantPolicy, config: PgStoreConfig) -> Result<Self, ConnectError> {
        let mut options: PgConnectOptions = url.parse().map_err(ConnectError::Unavailable)?;
        if let Some(lock_timeout) = config.lock_timeout {
            // Whole milliseconds, at least one: zero would mean "no timeout".
            let ms = lock_timeout.as_millis().max(1);
            options = options.options([("lock_timeout", format!("{ms}ms"))]);
        }
        let pool = connect_pool(options, config.connections_max, config.acquire_timeout)
            .await
            .map_err(ConnectError::Unavailable)?;
        Self::from_pool(pool, policy).await
    }

    /// `connect_with` over an existing pool, which should be opened with
    /// `connect_pool` as `connect_with`'s is.
    pub async fn from_pool(pool: PgPool, policy: GrantPolicy) -> Result<Self, ConnectError> {
        let applied = migrations::apply(&pool).await?;
        Ok(Self::new(Engine {
            pool,
            policy,
            guesses: unlocked::Guesses::default(),
            applied,
            #[cfg(feature = "testing")]
            _test_db: None,
        }))
    }

    fn new(engine: Engine) -> Self {
        Self { engine: Arc::new(engine), running: complete::Running::default(), tasks: true }
    }

    /// The same store with operations run in the caller's task, so that a
    /// dropped future stops them where they stand. Only for tests that show
    /// the connections stay clean even then.
    #[cfg(feature = "testing")]
    pub fn inline(&self) -> Self {
        Self { tasks: false, ..self.clone() }
    }

    /// A store on a test database, which is dropped when the store is.
    #[cfg(feature = "testing")]
    pub async fn on_test_db(db: crate::testing::TestDb, policy: GrantPolicy) -> Result<Self, ConnectError> {
        let applied = migrations::apply(db.pool()).await?;
        Ok(Self::new(Engine {
            pool: db.pool().clone(),
            policy,
            guesses: unlocked::Guesses::default(),
            applied,
            _test_db: Some(db),
        }))
    }

    pub fn pool(&self) -> &PgPool {
        &self.engine.pool
    }

    /// The migrations that connecting applied (empty when none were pending).
    pub fn applied_migrations(&self) -> &[AppliedMigration] {
        &self.engine.applied
    }

    /// Waits until no operation of this store (or of its clones) is running,
    /// including operations whose callers stopped waiting for them.
    pub async fn settled(&self) {
        self.running.settled().await;
    }
}

// ------------------------------------------------------------------- errors

fn corrupt(message: String) -> Error {
    Error::StorageCorrupt(message)
}

/// Operational failures are retryable; failures that mean the stored data or
/// schema is not what the store relies on are corruption, which needs repair.
fn storage_error(error: sqlx::Error) -> Error {
    use sqlx::Error as E;
    if let E::Database(db) = &error {
        // The statement failed as a whole and its transaction rolls back, so
        // these say that nothing was applied and a retry can succeed.
        let waited = match db.code().as_deref() {
            Some("55P03") => Some("a row it needs stayed locked past lock_timeout"),
            Some("40P01") => Some("PostgreSQL broke a lock cycle"),
            _ => None,
        };
        if let Some(why) = waited {
            return Error::StorageUnavailable(format!("{why}; nothing was applied, retry: {error}"));
        }
    }
    let corrupt_kind = match &error {
        E::Database(db) => {
            let code = db.code().unwrap_or_default();
            // 22: data exception, 23: integrity violation, 42: the schema is
            // not the one these statements were written for.
            code.starts_with("22") || code.starts_with("23") || code.starts_with("42")
        }
        E::RowNotFound
        | E::TypeNotFound { .. }
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Decode(_) => true,
        _ => false,
    };
    if corrupt_kind { Error::StorageCorrupt(error.to_string()) } else { Error::StorageUnavailable(error.to_string()) }
}

fn ingest_error(error: Error) -> IngestError {
    match error {
        Error::StorageUnavailable(message) => IngestError::Unavailable(message),
        Error::CounterOverflow { counter } => IngestError::Refused { counter },
        other => IngestError::Corrupt(other.to_string()),
    }
}

/// A stored counter below zero, which its column's `CHECK` forbids.
fn negative_counter(table: &str, key: &str, column: &str, value: i64) -> GuardViolation {
    GuardViolation { table: table.to_owned(), key: key.to_owned(), column: column.to_owned(), value }
}

/// A value the core decided, for a `BIGINT` column. The core keeps values in
/// `DOMAIN`, so a failure here is an overflow the domain should have refused.
fn db_i64(value: u64, counter: &'static str) -> Result<i64, Error> {
    i64::try_from(value).map_err(|_| Error::CounterOverflow { counter })
}

/// PostgreSQL text cannot hold NUL, so an identifier containing one cannot be
/// stored and is never found; it is not sent as a parameter either.
fn storable(text: &str) -> bool {
    !text.contains('\0')
}

// --------------------------------------------------------------- row types

// Column lists, spelled once. Every statement names its columns.
macro_rules! account_columns {
    () => {
        "a.account_id, a.credited, a.available, a.reserved, a.consumed, a.overage, a.billed, \
         a.next_fence"
    };
}
macro_rules! lease_columns {
    () => {
        "l.lease_id, l.account_id AS lease_account_id, l.fencing_token, l.capability_hash, \
         l.granted, l.used, l.state, l.expiry_floor_us, l.expiry_submicro_ns, \
         l.expiry_is_upper_bound"
    };
}
macro_rules! credential_columns {
    () => {
        "c.credential_id, c.account_id AS credential_account_id, c.label, c.key_hash, \
         c.created_floor_us, c.created_submicro_ns, c.revoked_floor_us, c.revoked_submicro_ns, \
         c.last_used_floor_us, c.last_used_submicro_ns, c.accepted_events, c.accepted_units"
    };
}

/// A lease with its account, for the reads that settle it.
macro_rules! held_lease_select {
    () => {
        concat!(
            "SELECT ",
            account_columns!(),
            ", ",
            lease_columns!(),
            " FROM tollgate_leases l JOIN tollgate_accounts a ON a.account_id = l.account_id"
        )
    };
}

mod complete;
mod idempotency;
mod tx;
mod unlocked;

use tx::Tx;
#[cfg(feature = "testing")]
pub use unlocked::ReleasePause;

use unlocked::Attempt;

#[derive(FromRow)]
struct AccountRow {
    account_id: String,
    credited: i64,
    available: i64,
    reserved: i64,
    consumed: i64,
    overage: i64,
    billed: i64,
    next_fence: i64,
}

impl AccountRow {
    fn decode(self) -> Result<Account, Error> {
        let id = &self.account_id;
        let counter = |name: &str, value: i64| {
            u64::try_from(value).map_err(|_| corrupt(format!("account {id}: {name} is {value}")))
        };
        let account = Account {
            credited: counter("credited", self.credited)?,
            available: counter("available", self.available)?,
            reserved: counter("reserved", self.reserved)?,
            consumed: counter("consumed", self.consumed)?,
            overage: counter("overage", self.overage)?,
            billed: counter("billed", self.billed)?,
            next_fence: counter("next_fence", self.next_fence)?,
            account_id: String::new(),
        };
        if account.next_fence == 0 {
            return Err(corrupt(format!("account {id}: next_fence is 0")));
        }
        Ok(Account { account_id: self.account_id, ..account })
    }
}

#[derive(FromRow)]
struct LeaseRow {
    lease_id: String,
    lease_account_id: String,
    fencing_token: i64,
    capability_hash: Vec<u8>,
    granted: i64,
    used: i64,
    state: String,
    expiry_floor_us: i64,
    expiry_submicro_ns: i16,
    expiry_is_upper_bound: bool,
}

/// A lease with the hash of its capability, which only stores see.
struct LeaseRecord {
    lease: Lease,
    capability: SecretHash,
}

impl LeaseRow {
    fn decode(self) -> Result<LeaseRecord, Error> {
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
struct HeldLeaseRow {
    #[sqlx(flatten)]
    account: AccountRow,
    #[sqlx(flatten)]
    lease: LeaseRow,
}

#[derive(FromRow)]
struct CredentialRow {
    credential_id: String,
    credential_account_id: String,
    label: String,
    key_hash: Vec<u8>,
    created_floor_us: i64,
    created_submicro_ns: i16,
    revoked_floor_us: Option<i64>,
    revoked_submicro_ns: Option<i16>,
    last_used_floor_us: Option<i64>,
    last_used_submicro_ns: Option<i16>,
    accepted_events: i64,
    accepted_units: i64,
}

struct CredentialRecord {
    credential: Credential,
    key: SecretHash,
}

impl CredentialRow {
    fn decode(self) -> Result<CredentialRecord, Error> {
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

// ---------------------------------------------------------------- persisting

/// Everything one operation decided, written by one statement.
#[derive(Default)]
struct Changes<'a> {
    /// Accounts with their new counters.
    accounts: Vec<Account>,
    /// Existing leases with their new `used` and `state`.
    leases: Vec<Lease>,
    /// New leases with their capability hashes.
    granted: Vec<(Lease, SecretHash)>,
    /// Credentials with their new activity.
    credentials: Vec<Credential>,
    /// Newly accepted usage events.
    events: Vec<&'a UsageEvent>,
}

/// The one write statement. Each data-modifying CTE consumes parallel arrays
/// (empty ones are no-ops), so every operation persists in one round trip, and
/// the counts returned prove every intended row was written.
const PERSIST_SQL: &str = "
WITH accounts AS (
    UPDATE tollgate_accounts AS a
    SET credited = u.credited, available = u.available, reserved = u.reserved,
        consumed = u.consumed, overage = u.overage, billed = u.billed,
        next_fence = u.next_fence
    FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
                $7::int8[], $8::int8[])
        AS u(account_id, credited, available, reserved, consumed, overage, billed, next_fence)
    WHERE a.account_id = u.account_id
    RETURNING 1
), leases AS (
    UPDATE tollgate_leases AS l
    SET used = u.used, state = u.state,
        settled_at = CASE WHEN u.state = 'active' THEN NULL ELSE coalesce(l.settled_at, now()) END
    FROM unnest($9::text[], $10::int8[], $11::text[]) AS u(lease_id, used, state)
    WHERE l.lease_id = u.lease_id
    RETURNING 1
), granted AS (
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted,
        used, state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    SELECT u.lease_id, u.account_id, u.fencing_token, u.capability_hash, u.granted,
        u.used, u.state, u.expiry_floor_us, u.expiry_submicro_ns, u.expiry_is_upper_bound
    FROM unnest($12::text[], $13::text[], $14::int8[], $15::bytea[], $16::int8[], $17::int8[],
                $18::text[], $19::int8[], $20::int2[], $21::bool[])
        AS u(lease_id, account_id, fencing_token, capability_hash, granted, used, state,
             expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    RETURNING 1
), credentials AS (
    UPDATE tollgate_credentials AS c
    SET accepted_events = u.accepted_events, accepted_units = u.accepted_units,
        last_used_floor_us = u.last_used_floor_us, last_used_submicro_ns = u.last_used_submicro_ns
    FROM unnest($22::text[], $23::int8[], $24::int8[], $25::int8[], $26::int2[])
        AS u(credential_id, accepted_events, accepted_units, last_used_floor_us,
             last_used_submicro_ns)
    WHERE c.credential_id = u.credential_id
    RETURNING 1
), events AS (
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
        occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token)
    SELECT u.account_id, u.request_id, u.credential_id, u.units, u.occurred_at_floor_us,
        u.occurred_at_submicro_ns, u.lease_id, u.fencing_token
    FROM unnest($27::text[], $28::text[], $29::text[], $30::int8[], $31::int8[], $32::int2[],
                $33::text[], $34::int8[])
        AS u(account_id, request_id, credential_id, units, occurred_at_floor_us,
             occurred_at_submicro_ns, lease_id, fencing_token)
    RETURNING 1
)
SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM leases),
       (SELECT count(*) FROM granted), (SELECT count(*) FROM credentials),
       (SELECT count(*) FROM events)";

async fn persist(conn: &mut PgConnection, changes: &Changes<'_>) -> Result<(), Error> {
    let mut query = sqlx::query_as::<_, (i64, i64, i64, i64, i64)>(PERSIST_SQL);

    let a = &changes.accounts;
    let column = |f: fn(&Account) -> u64, name: &'static str| {
        a.iter().map(|account| db_i64(f(account), name)).collect::<Result<Vec<i64>, Error>>()
    };
    query = query
        .bind(a.iter().map(|x| x.account_id.clone()).collect::<Vec<_>>())
        .bind(column(|x| x.credited, "credited")?)
        .bind(column(|x| x.available, "available")?)
        .bind(column(|x| x.reserved, "reserved")?)
        .bind(column(|x| x.consumed, "consumed")?)
        .bind(column(|x| x.overage, "overage")?)
        .bind(column(|x| x.billed, "billed")?)
        .bind(column(|x| x.next_fence, "next_fence")?);

    let l = &changes.leases;
    query = query
        .bind(l.iter().map(|x| x.lease_id.clone()).collect::<Vec<_>>())
        .bind(l.iter().map(|x| db_i64(x.used, "lease_used")).collect::<Result<Vec<_>, _>>()?)
        .bind(l.iter().map(|x| x.state.as_str().to_owned()).collect::<Vec<_>>());

    let g = &changes.granted;
    let expiries: Vec<InstantPair> = g.iter().map(|(x, _)| InstantPair::encode(x.expiry)).collect();
    query = query
        .bind(g.iter().map(|(x, _)| x.lease_id.clone()).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| x.account_id.clone()).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| db_i64(x.fencing_token, "next_fence")).collect::<Result<Vec<_>, _>>()?)
        .bind(g.iter().map(|(_, hash)| hash.as_bytes().to_vec()).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| db_i64(x.granted, "granted")).collect::<Result<Vec<_>, _>>()?)
        .bind(g.iter().map(|(x, _)| db_i64(x.used, "lease_used")).collect::<Result<Vec<_>, _>>()?)
        .bind(g.iter().map(|(x, _)| x.state.as_str().to_owned()).collect::<Vec<_>>())
        .bind(expiries.iter().map(|p| p.floor_us).collect::<Vec<_>>())
        .bind(expiries.iter().map(|p| p.submicro_ns).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| x.expiry_is_upper_bound).collect::<Vec<_>>());

    let c = &changes.credentials;
    let last_used: Vec<Option<InstantPair>> = c.iter().map(|x| x.last_used_at.map(InstantPair::encode)).collect();
    query = query
        .bind(c.iter().map(|x| x.credential_id.clone()).collect::<Vec<_>>())
        .bind(c.iter().map(|x| db_i64(x.accepted_events, "credential_accepted_events")).collect::<Result<Vec<_>, _>>()?)
        .bind(c.iter().map(|x| db_i64(x.accepted_units, "credential_accepted_units")).collect::<Result<Vec<_>, _>>()?)
        .bind(last_used.iter().map(|p| p.map(|p| p.floor_us)).collect::<Vec<_>>())
        .bind(last_used.iter().map(|p| p.map(|p| p.submicro_ns)).collect::<Vec<_>>());

    let e = &changes.events;
    let occurred: Vec<InstantPair> = e.iter().map(|x| InstantPair::encode(x.occurred_at)).collect();
    query = query
        .bind(e.iter().map(|x| x.account_id.clone()).collect::<Vec<_>>())
        .bind(e.iter().map(|x| x.request_id.clone()).collect::<Vec<_>>())
        .bind(e.iter().map(|x| x.credential_id.clone()).collect::<Vec<_>>())
        .bind(e.iter().map(|x| db_i64(x.units, "units")).collect::<Result<Vec<_>, _>>()?)
        .bind(occurred.iter().map(|p| p.floor_us).collect::<Vec<_>>())
        .bind(occurred.iter().map(|p| p.submicro_ns).collect::<Vec<_>>())
        .bind(e.iter().map(|x| x.lease_id.clone()).collect::<Vec<_>>())
        .bind(
            e.iter()
                .map(|x| x.fencing_token.map(|f| db_i64(f, "fencing_token")).transpose())
                .collect::<Result<Vec<_>, _>>()?,
        );

    let written = query.fetch_one(&mut *conn).await.map_err(storage_error)?;
    let expected = (a.len(), l.len(), g.len(), c.len(), e.len());
    let written_usize =
        (written.0 as usize, written.1 as usize, written.2 as usize, written.3 as usize, written.4 as usize);
    if written_usize != expected {
        return Err(corrupt(format!(
            "wrote {written_usize:?} (accounts, leases, new leases, credentials, events) rows, \
             expected {expected:?}: rows vanished under their locks"
        )));
    }
    Ok(())
}

// ------------------------------------------------------------------ loading

/// Loads one account with `sql`, a read by `account_id` ($1) that may lock it.
async fn load_account(conn: &mut PgConnection, sql: &'static str, account_id: &str) -> Result<Account, Error> {
    if !storable(account_id) {
        return Err(Error::AccountNotFound);
    }
    let row: Option<AccountRow> =
        sqlx::query_as(sql).bind(account_id).fetch_optional(&mut *conn).await.map_err(storage_error)?;
    row.ok_or(Error::AccountNotFound)?.decode()
}

/// Locks one account.
async fn lock_account(conn: &mut PgConnection, account_id: &str) -> Result<Account, Error> {
    let sql =
        concat!("SELECT ", account_columns!(), " FROM tollgate_accounts a WHERE a.account_id = $1 FOR NO KEY UPDATE");
    load_account(conn, sql, account_id).await
}

/// Loads a lease and its account with `sql`, a `held_lease_select!` by
/// `lease_id` ($1) that may lock both.
async fn load_held(
    conn: &mut PgConnection,
    sql: &'static str,
    lease_id: &str,
) -> Result<(Account, LeaseRecord), Error> {
    let row: Option<HeldLeaseRow> =
        sqlx::query_as(sql).bind(lease_id).fetch_optional(&mut *conn).await.map_err(storage_error)?;
    let row = row.ok_or(Error::LeaseNotFound)?;
    Ok((row.account.decode()?, row.lease.decode()?))
}

/// What locking an account another transaction holds does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Busy {
    /// Wait for it.
    Wait,
    /// Leave the account out of the result.
    Skip,
}

/// Locks accounts in `account_id` order.
async fn lock_accounts(
    conn: &mut PgConnection,
    account_ids: &[String],
    busy: Busy,
) -> Result<BTreeMap<String, Account>, Error> {
    let rows = lock_account_rows(conn, account_ids, busy).await?;
    rows.into_iter().map(|row| row.decode().map(|account| (account.account_id.clone(), account))).collect()
}

/// Locks accounts in `account_id` order, without decoding them.
async fn lock_account_rows(
    conn: &mut PgConnection,
    account_ids: &[String],
    busy: Busy,
) -> Result<Vec<AccountRow>, Error> {
    let sql = if busy == Busy::Skip {
        concat!(
            "SELECT ",
            account_columns!(),
            " FROM tollgate_accounts a WHERE a.account_id = ANY($1) ORDER BY a.account_id \
             FOR NO KEY UPDATE SKIP LOCKED"
        )
    } else {
        concat!(
            "SELECT ",
            account_columns!(),
            " FROM tollgate_accounts a WHERE a.account_id = ANY($1) ORDER BY a.account_id \
             FOR NO KEY UPDATE"
        )
    };
    sqlx::query_as(sql).bind(account_ids).fetch_all(&mut *conn).await.map_err(storage_error)
}

/// Locks, in `lease_id` order, the leases among `lease_ids` that belong to
/// `account_ids`, whose rows the caller has locked already. A lease of any
/// other account is neither locked nor returned: locking it would take a lease
/// lock without its account's lock, which a concurrent writer holding that
/// account (a reclaim pass, say) could wait on in a cycle. The core treats a
/// lease of another account as it treats one it does not find.
async fn lock_leases(
    conn: &mut PgConnection,
    lease_ids: &[String],
    account_ids: &[String],
) -> Result<HashMap<String, LeaseRecord>, Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(concat!(
        "SELECT ",
        lease_columns!(),
        " FROM tollgate_leases l WHERE l.lease_id = ANY($1) AND l.account_id = ANY($2) \
         ORDER BY l.lease_id FOR UPDATE"
    ))
    .bind(lease_ids)
    .bind(account_ids)
    .fetch_all(&mut *conn)
    .await
    .map_err(storage_error)?;
    rows.into_iter().map(|row| row.decode().map(|record| (record.lease.lease_id.clone(), record))).collect()
}

/// Reads leases without locking them: for leases of other accounts, which the
/// core only refuses, on columns (`account_id`, the capability hash) that
/// never change.
async fn read_leases(conn: &mut PgConnection, lease_ids: &[String]) -> Result<HashMap<String, LeaseRecord>, Error> {
    let rows: Vec<LeaseRow> =
        sqlx::query_as(concat!("SELECT ", lease_columns!(), " FROM tollgate_leases l WHERE l.lease_id = ANY($1)"))
            .bind(lease_ids)
            .fetch_all(&mut *conn)
            .await
            .map_err(storage_error)?;
    rows.into_iter().map(|row| row.decode().map(|record| (record.lease.lease_id.clone(), record))).collect()
}

/// The lease, after checking the caller's capability against its hash.
fn held(record: Option<&LeaseRecord>, capability: &str) -> Result<Lease, Error> {
    let record = record.ok_or(Error::LeaseNotFound)?;
    if !record.capability.matches(capability) {
        return Err(Error::CapabilityMismatch);
    }
    Ok(record.lease.clone())
}

/// Sorted, deduplicated, storable values.
fn sorted_ids<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    ids.into_iter().filter(|id| storable(id)).collect::<BTreeSet<&str>>().into_iter().map(str::to_owned).collect()
}

/// Ends an operation's transaction: commits what succeeded, and rolls back
/// what failed at once, so its row locks are released before the error
/// reaches the caller (a dropped transaction would release them only when its
/// pooled connection is next used).
async fn finish<T>(tx: Tx, result: Result<T, Error>) -> Result<T, Error> {
    match result {
        Ok(value) => {
            tx.commit().await.map_err(storage_error)?;
            Ok(value)
        }
        Err(error) => {
            rollback(tx).await;
            Err(error)
        }
    }
}

/// Rolls back, best effort: if even that fails, the connection is closed
/// instead of going back to the pool, and PostgreSQL ends the transaction.
async fn rollback(tx: Tx) {
    let _ = tx.rollback().await;
}

/// Inserts a new credential of an existing account.
async fn insert_credential(
    conn: &mut PgConnection,
    account_id: &str,
    label: &str,
    now: Timestamp,
) -> Result<IssuedCredential, Error> {
    let key = new_credential_key();
    let credential = Credential {
        credential_id: new_credential_id(),
        account_id: account_id.to_owned(),
        label: label.to_owned(),
        created_at: now,
        revoked_at: None,
        last_used_at: None,
        accepted_events: 0,
        accepted_units: 0,
    };
    let created = InstantPair::encode(now);
    let inserted = sqlx::query(
        "INSERT INTO tollgate_credentials (credential_id, account_id, label, key_hash, \
         created_floor_us, created_submicro_ns, accepted_events, accepted_units) \
         SELECT $1, a.account_id, $3, $4, $5, $6, 0, 0 \
         FROM tollgate_accounts a WHERE a.account_id = $2",
    )
    .bind(&credential.credential_id)
    .bind(account_id)
    .bind(label)
    .bind(key.hash().as_bytes().to_vec())
    .bind(created.floor_us)
    .bind(created.submicro_ns)
    .execute(conn)
    .await
    .map_err(storage_error)?;
    if inserted.rows_affected() == 0 {
        return Err(Error::AccountNotFound);
    }
    Ok(IssuedCredential { credential, key })
}

/// Revokes a credential under its row lock; revoking again keeps the first
/// revocation time.
async fn revoke_locked(conn: &mut PgConnection, credential_id: &str, now: Timestamp) -> Result<Credential, Error> {
    let row: Option<CredentialRow> = sqlx::query_as(concat!(
        "SELECT ",
        credential_columns!(),
        " FROM tollgate_credentials c WHERE c.credential_id = $1 FOR UPDATE"
    ))
    .bind(credential_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(storage_error)?;
    let mut credential = row.ok_or(Error::CredentialNotFound)?.decode()?.credential;
    credential.revoke(now);
    let revoked = credential.revoked_at.map(InstantPair::encode);
    sqlx::query(
        "UPDATE tollgate_credentials SET revoked_floor_us = $2, revoked_submicro_ns = $3 \
         WHERE credential_id = $1",
    )
    .bind(credential_id)
    .bind(revoked.map(|p| p.floor_us))
    .bind(revoked.map(|p| p.submicro_ns))
    .execute(conn)
    .await
    .map_err(storage_error)?;
    Ok(credential)
}

impl Engine {
    async fn begin(&self) -> Result<Tx, Error> {
        Tx::begin(&self.pool).await.map_err(storage_error)
    }

    /// Names a lease the core granted and draws its capability.
    fn issue(account_id: &str, grant: ledger::Grant) -> IssuedLease {
        let capability = new_capability();
        IssuedLease { lease: grant.into_lease(new_lease_id(), account_id.to_owned()), capability }
    }

    /// Grants a lease the core decided and stages it for persisting.
    fn stage_grant(account_id: &str, grant: ledger::Grant, changes: &mut Changes<'_>) -> IssuedLease {
        let issued = Self::issue(account_id, grant);
        changes.granted.push((issued.lease.clone(), issued.capability.hash()));
        issued
    }

    async fn acquire_locked(
        &self,
        conn: &mut PgConnection,
        account_id: &str,
        units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<IssuedLease, Error> {
        let mut account = lock_account(conn, account_id).await?;
        let grant = ledger::acquire(&mut account, units, ttl, now, &self.policy, DOMAIN)?;
        let mut changes = Changes::default();
        let issued = Self::stage_grant(account_id, grant, &mut changes);
        changes.accounts.push(account);
        persist(conn, &changes).await?;
        Ok(issued)
    }

    async fn release_locked(
        &self,
        conn: &mut PgConnection,
        lease_id: &str,
        capability: &str,
        now: Timestamp,
    ) -> Result<Released, Error> {
        // One locking read for both rows; the OF clauses lock the account
        // before the lease, the global lock order.
        let sql = concat!(held_lease_select!(), " WHERE l.lease_id = $1 FOR NO KEY UPDATE OF a FOR UPDATE OF l");
        let (mut account, record) = load_held(conn, sql, lease_id).await?;
        let mut lease = held(Some(&record), capability)?;
        let settlement = ledger::release(&mut account, &mut lease, now, &self.policy, DOMAIN)?;
        let changes = Changes { accounts: vec![account], leases: vec![lease.clone()], ..Changes::default() };
        persist(conn, &changes).await?;
        Ok(Released { lease, settlement })
    }

    async fn consolidate_locked(
        &self,
        conn: &mut PgConnection,
        account_id: &str,
        sources: &[LeaseHandle],
        extra_units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Consolidated, Error> {
        let mut account = lock_account(conn, account_id).await?;
        let lease_ids = sorted_ids(sources.iter().map(|h| h.lease_id.as_str()));
        let mut records = lock_leases(conn, &lease_ids, &[account_id.to_owned()]).await?;
        // Leases of other accounts are read, not locked: the core refuses
        // them (`mixed_accounts`) exactly as before.
        let foreign: Vec<String> = lease_ids.iter().filter(|id| !records.contains_key(*id)).cloned().collect();
        if !foreign.is_empty() {
            records.extend(read_leases(conn, &foreign).await?);
        }
        let mut leases = sources
            .iter()
            .map(|handle| held(records.get(&handle.lease_id), &handle.capability))
            .collect::<Result<Vec<_>, _>>()?;
        let (grant, settlements) =
            ledger::consolidate(&mut account, &mut leases, extra_units, ttl, now, &self.policy, DOMAIN)?;
        let mut changes = Changes { leases: leases.clone(), ..Changes::default() };
        let lease = Self::stage_grant(account_id, grant, &mut changes);
        changes.accounts.push(account);
        persist(conn, &changes).await?;
        Ok(Consolidated { lease, settlements: leases.into_iter().zip(settlements).collect() })
    }

    /// The locking reclaim pass: locks due leases and then their accounts,
    /// both with `SKIP LOCKED`, so it never waits. Corrupt rows are skipped
    /// and reported, as on the unlocked path.
    async fn reclaim_locking(
        &self,
        tx: &mut PgConnection,
        now: Timestamp,
        cutoff: InstantPair,
        limit: u32,
    ) -> Result<ReclaimReport, Error> {
        let rows: Vec<LeaseRow> = sqlx::query_as(concat!(
            "SELECT ",
            lease_columns!(),
            " FROM tollgate_leases l WHERE l.state = 'active' \
             AND (l.expiry_floor_us, l.expiry_submicro_ns) <= ($1, $2) \
             ORDER BY l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id \
             LIMIT $3 FOR UPDATE SKIP LOCKED"
        ))
        .bind(cutoff.floor_us)
        .bind(cutoff.submicro_ns)
        .bind(i64::from(reclaim_read_max(limit)))
        .fetch_all(&mut *tx)
        .await
        .map_err(storage_error)?;
        let mut skipped = Vec::new();
        let mut due = Vec::with_capacity(rows.len());
        for row in rows {
            if due.len() == limit as usize {
                break;
            }
            let (lease_id, account_id) = (row.lease_id.clone(), row.lease_account_id.clone());
            match row.decode() {
                Ok(record) => due.push(record.lease),
                Err(error) => skipped.push(unlocked::skip(&lease_id, &account_id, &error)),
            }
        }
        due.sort_by(|a, b| (&a.account_id, &a.lease_id).cmp(&(&b.account_id, &b.lease_id)));
        let account_ids = sorted_ids(due.iter().map(|l| l.account_id.as_str()));
        let mut accounts = BTreeMap::new();
        let mut corrupt_accounts = HashMap::new();
        for row in lock_account_rows(tx, &account_ids, Busy::Skip).await? {
            let account_id = row.account_id.clone();
            match row.decode() {
                Ok(account) => {
                    accounts.insert(account_id, account);
                }
                Err(error) => {
                    corrupt_accounts.insert(account_id, error);
                }
            }
        }

        let mut reclaimed = Vec::with_capacity(due.len());
        let mut changes = Changes::default();
        for mut lease in due {
            if let Some(error) = corrupt_accounts.get(&lease.account_id) {
                skipped.push(unlocked::skip(&lease.lease_id, &lease.account_id, error));
                continue;
            }
            // Not locked: another transaction holds the account; next pass.
            let Some(account) = accounts.get_mut(&lease.account_id) else {
                continue;
            };
            match ledger::reclaim(account, &mut lease, now, &self.policy, DOMAIN) {
                Ok(Some(settlement)) => {
                    reclaimed.push(ReclaimedLease {
                        lease_id: lease.lease_id.clone(),
                        account_id: lease.account_id.clone(),
                        settlement,
                    });
                    changes.leases.push(lease);
                }
                Ok(None) => {}
                Err(error) => skipped.push(unlocked::skip(&lease.lease_id, &lease.account_id, &error)),
            }
        }
        let touched: BTreeSet<&str> = changes.leases.iter().map(|l| l.account_id.as_str()).collect();
        changes.accounts = accounts.into_values().filter(|a| touched.contains(a.account_id.as_str())).collect();
        if !changes.leases.is_empty() {
            persist(tx, &changes).await?;
        }
        Ok(ReclaimReport { reclaimed, skipped, limit })
    }

    async fn ingest_inner(&self, batch: &[UsageEvent], now: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        // Bound what is loaded before loading it; the core enforces the same bound.
        if batch.len() > BATCH_EVENTS_MAX {
            return Err(IngestError::BatchTooLarge { events: batch.len(), max: BATCH_EVENTS_MAX });
        }
        let account_ids = sorted_ids(batch.iter().map(|e| e.account_id.as_str()));
        let lease_ids = sorted_ids(batch.iter().filter_map(|e| e.lease_id.as_deref()));
        let credential_ids = sorted_ids(batch.iter().map(|e| e.credential_id.as_str()));
        let request_ids = sorted_ids(batch.iter().map(|e| e.request_id.as_str()));

        let mut tx = self.begin().await.map_err(ingest_error)?;
        let result: Result<Vec<EventOutcome>, IngestError> = async {
            let mut snapshot = UsageSnapshot {
                accounts: lock_accounts(&mut tx, &account_ids, Busy::Wait)
                    .await
                    .map_err(ingest_error)?
                    .into_iter()
                    .collect(),
                ..UsageSnapshot::default()
            };
            if !lease_ids.is_empty() {
                let locked: Vec<String> = snapshot.accounts.keys().cloned().collect();
                snapshot.leases = lock_leases(&mut tx, &lease_ids, &locked)
                    .await
                    .map_err(ingest_error)?
                    .into_iter()
                    .map(|(id, record)| (id, record.lease))
                    .collect();
            }
            let credentials: Vec<CredentialRow> = sqlx::query_as(concat!(
                "SELECT ",
                credential_columns!(),
                " FROM tollgate_credentials c WHERE c.credential_id = ANY($1) \
             ORDER BY c.credential_id FOR UPDATE"
            ))
            .bind(&credential_ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| ingest_error(storage_error(e)))?;
            for row in credentials {
                let record = row.decode().map_err(ingest_error)?;
                snapshot.credentials.insert(record.credential.credential_id.clone(), record.credential);
            }
            // Read after the account locks, so no accepted ID of these accounts can
            // be missing from this statement's snapshot.
            let recorded: Vec<(String, String)> = sqlx::query_as(
                "SELECT u.account_id, u.request_id FROM tollgate_usage_events u \
             WHERE u.account_id = ANY($1) AND u.request_id = ANY($2)",
            )
            .bind(&account_ids)
            .bind(&request_ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| ingest_error(storage_error(e)))?;
            snapshot.recorded = recorded.into_iter().collect::<HashSet<_>>();

            let plan = usage::classify(batch, now, &self.policy, DOMAIN, &snapshot)?;
            if plan.accepted.is_empty() {
                return Ok(plan.outcomes);
            }
            let changes = Changes {
                accounts: plan.accounts.into_values().collect(),
                leases: plan.leases.into_values().collect(),
                credentials: plan.credentials.into_values().collect(),
                events: plan.accepted.iter().map(|&index| &batch[index]).collect(),
                granted: Vec::new(),
            };
            persist(&mut tx, &changes).await.map_err(ingest_error)?;
            Ok(plan.outcomes)
        }
        .await;
        match result {
            Ok(outcomes) => {
                tx.commit().await.map_err(|e| ingest_error(storage_error(e)))?;
                Ok(outcomes)
            }
            Err(error) => {
                rollback(tx).await;
                Err(error)
            }
        }
    }

    fn view_of(account: Account, active_leases: u64) -> AccountView {
        AccountView { account, active_leases }
    }
}

#[async_trait]
impl UsageSink for Engine {
    async fn ingest(&self, batch: Vec<UsageEvent>, now: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        self.ingest_inner(&batch, now).await
    }
}

#[async_trait]
impl Store for Engine {
    fn policy(&self) -> &GrantPolicy {
        &self.policy
    }

    fn unit_domain(&self) -> UnitDomain {
        DOMAIN
    }

    async fn create_account(&self, account_id: &str) -> Result<AccountView, Error> {
        validate_id("account_id", account_id)?;
        let account = Account::new(account_id.to_owned());
        let inserted = sqlx::query(
            "INSERT INTO tollgate_accounts (account_id, credited, available, reserved, consumed, \
             overage, billed, next_fence) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (account_id) DO NOTHING",
        )
        .bind(&account.account_id)
        .bind(db_i64(account.credited, "credited")?)
        .bind(db_i64(account.available, "available")?)
        .bind(db_i64(account.reserved, "reserved")?)
        .bind(db_i64(account.consumed, "consumed")?)
        .bind(db_i64(account.overage, "overage")?)
        .bind(db_i64(account.billed, "billed")?)
        .bind(db_i64(account.next_fence, "next_fence")?)
        .execute(&self.pool)
        .await
        .map_err(storage_error)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::AccountExists);
        }
        Ok(Self::view_of(account, 0))
    }

    async fn credit(&self, account_id: &str, credit_id: &str, units: u64) -> Result<CreditReceipt, Error> {
        validate_id("account_id", account_id)?;
        validate_id("credit_id", credit_id)?;
        let mut tx = self.begin().await?;
        let result: Result<CreditReceipt, Error> = async {
            let mut account = lock_account(&mut tx, account_id).await?;
            // Read after the lock, so a concurrent credit with this id is seen.
            let (existing_units, active): (Option<i64>, i64) = sqlx::query_as(
                "SELECT (SELECT c.units FROM tollgate_credits c WHERE c.account_id = $1 AND c.credit_id = $2), \
                    (SELECT count(*) FROM tollgate_leases l WHERE l.account_id = $1 AND l.state = 'active')",
            )
            .bind(account_id)
            .bind(credit_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(storage_error)?;
            let active_leases = active.unsigned_abs();
            if let Some(existing_units) = existing_units {
                let existing_units = u64::try_from(existing_units)
                    .map_err(|_| corrupt(format!("credit {account_id}/{credit_id}: units is {existing_units}")))?;
                if existing_units != units {
                    return Err(Error::CreditConflict { existing_units });
                }
                return Ok(CreditReceipt { account: Self::view_of(account, active_leases), created: false });
            }
            account.credit(units, DOMAIN)?;
            sqlx::query(
                "WITH credited AS (
                 UPDATE tollgate_accounts AS a SET credited = $3, available = $4
                 WHERE a.account_id = $1
                 RETURNING a.account_id
             )
             INSERT INTO tollgate_credits (account_id, credit_id, units)
             SELECT credited.account_id, $2, $5 FROM credited",
            )
            .bind(account_id)
            .bind(credit_id)
            .bind(db_i64(account.credited, "credited")?)
            .bind(db_i64(account.available, "available")?)
            .bind(db_i64(units, "units")?)
            .execute(&mut *tx)
            .await
            .map_err(storage_error)?;
            Ok(CreditReceipt { account: Self::view_of(account, active_leases), created: true })
        }
        .await;
        finish(tx, result).await
    }

    async fn acquire_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        account_id: &str,
        units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<IssuedLease, Error> {
        if let Some(idempotency) = idempotency {
            let request = Request::Acquire { account_id, units, ttl };
            let operation =
                async |conn: &mut PgConnection| self.acquire_locked(conn, account_id, units, ttl, now).await;
            return self.keyed(idempotency, request, now, operation).await;
        }
        if let Attempt::Done(issued) = self.acquire_unlocked(account_id, units, ttl, now).await? {
            return Ok(issued);
        }
        let mut tx = self.begin().await?;
        let result = self.acquire_locked(&mut tx, account_id, units, ttl, now).await;
        finish(tx, result).await
    }

    async fn release_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        lease_id: &str,
        capability: &str,
        now: Timestamp,
    ) -> Result<Released, Error> {
        if !storable(lease_id) {
            return Err(Error::LeaseNotFound);
        }
        if let Some(idempotency) = idempotency {
            let request = Request::Release { lease_id, capability };
            let operation = async |conn: &mut PgConnection| self.release_locked(conn, lease_id, capability, now).await;
            return self.keyed(idempotency, request, now, operation).await;
        }
        if let Attempt::Done(released) = self.release_unlocked(lease_id, capability, now).await? {
            return Ok(released);
        }
        let mut tx = self.begin().await?;
        let result = self.release_locked(&mut tx, lease_id, capability, now).await;
        finish(tx, result).await
    }

    async fn consolidate_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        account_id: &str,
        sources: &[LeaseHandle],
        extra_units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Consolidated, Error> {
        let operation = async |conn: &mut PgConnection| {
            self.consolidate_locked(conn, account_id, sources, extra_units, ttl, now).await
        };
        if let Some(idempotency) = idempotency {
            let request = Request::Consolidate { account_id, sources, extra_units, ttl };
            return self.keyed(idempotency, request, now, operation).await;
        }
        let mut tx = self.begin().await?;
        let result = operation(&mut tx).await;
        finish(tx, result).await
    }

    async fn reclaim(&self, now: Timestamp, limit: u32) -> Result<ReclaimReport, Error> {
        let limit = limit.min(self.policy.reclaim_batch_max());
        let Some(cutoff) = self.policy.reclaim_cutoff(now) else {
            return Ok(ReclaimReport { limit, ..ReclaimReport::default() });
        };
        if limit == 0 {
            return Ok(ReclaimReport { limit, ..ReclaimReport::default() });
        }
        let cutoff = InstantPair::encode(cutoff);
        if let Attempt::Done(report) = self.reclaim_unlocked(now, cutoff, limit).await? {
            return Ok(report);
        }
        let mut tx = self.begin().await?;
        let result = self.reclaim_locking(&mut tx, now, cutoff, limit).await;
        finish(tx, result).await
    }

    async fn issue_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        account_id: &str,
        label: &str,
        now: Timestamp,
    ) -> Result<IssuedCredential, Error> {
        validate_label(label)?;
        // PostgreSQL text cannot hold NUL; such a label is not storable here.
        if !storable(label) {
            return Err(Error::InvalidLabel);
        }
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let operation = async |conn: &mut PgConnection| insert_credential(conn, account_id, label, now).await;
        if let Some(idempotency) = idempotency {
            let request = Request::IssueCredential { account_id, label };
            return self.keyed(idempotency, request, now, operation).await;
        }
        let mut conn = self.pool.acquire().await.map_err(storage_error)?;
        operation(&mut conn).await
    }

    async fn verify_credential(&self, key: &str) -> Result<Verification, Error> {
        let hash = SecretHash::of(key);
        let row: Option<CredentialRow> = sqlx::query_as(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tollgate_credentials c WHERE c.key_hash = $1"
        ))
        .bind(hash.as_bytes().to_vec())
        .fetch_optional(&self.pool)
        .await
        .map_err(storage_error)?;
        let record = row.map(CredentialRow::decode).transpose()?.filter(|record| record.key.matches(key));
        Ok(match record {
            None => {
                Verification { valid: false, credential_id: None, account_id: None, reason: Some("unknown_credential") }
            }
            Some(record) => {
                let credential = record.credential;
                let revoked = credential.revoked_at.is_some();
                Verification {
                    valid: !revoked,
                    credential_id: Some(credential.credential_id),
                    account_id: Some(credential.account_id),
                    reason: revoked.then_some("credential_revoked"),
                }
            }
        })
    }

    async fn revoke_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        credential_id: &str,
        now: Timestamp,
    ) -> Result<Credential, Error> {
        if !storable(credential_id) {
            return Err(Error::CredentialNotFound);
        }
        let operation = async |conn: &mut PgConnection| revoke_locked(conn, credential_id, now).await;
        if let Some(idempotency) = idempotency {
            let request = Request::RevokeCredential { credential_id };
            return self.keyed(idempotency, request, now, operation).await;
        }
        let mut tx = self.begin().await?;
        let result = operation(&mut tx).await;
        finish(tx, result).await
    }

    async fn purge_idempotency(&self, now: Timestamp, limit: u32) -> Result<u32, Error> {
        self.purge_expired_keys(now, limit).await
    }

    async fn account(&self, account_id: &str) -> Result<AccountView, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        #[derive(FromRow)]
        struct Row {
            #[sqlx(flatten)]
            account: AccountRow,
            active_leases: i64,
        }
        let row: Option<Row> = sqlx::query_as(concat!(
            "SELECT ",
            account_columns!(),
            ", (SELECT count(*) FROM tollgate_leases l \
                WHERE l.account_id = a.account_id AND l.state = 'active') AS active_leases \
             FROM tollgate_accounts a WHERE a.account_id = $1"
        ))
        .bind(account_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(storage_error)?;
        let row = row.ok_or(Error::AccountNotFound)?;
        Ok(Self::view_of(row.account.decode()?, row.active_leases.unsigned_abs()))
    }

    async fn lease(&self, lease_id: &str) -> Result<Lease, Error> {
        if !storable(lease_id) {
            return Err(Error::LeaseNotFound);
        }
        let row: Option<LeaseRow> =
            sqlx::query_as(concat!("SELECT ", lease_columns!(), " FROM tollgate_leases l WHERE l.lease_id = $1"))
                .bind(lease_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(storage_error)?;
        Ok(row.ok_or(Error::LeaseNotFound)?.decode()?.lease)
    }

    async fn credential(&self, credential_id: &str) -> Result<Credential, Error> {
        if !storable(credential_id) {
            return Err(Error::CredentialNotFound);
        }
        let row: Option<CredentialRow> = sqlx::query_as(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tollgate_credentials c WHERE c.credential_id = $1"
        ))
        .bind(credential_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(storage_error)?;
        Ok(row.ok_or(Error::CredentialNotFound)?.decode()?.credential)
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        // One snapshot for the whole report, read in bounded pages of accounts.
        let mut tx = self.begin().await?;
        let result: Result<CheckReport, Error> = async {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await
                .map_err(storage_error)?;
            // The guard inspection (`inspect.rs`), in the same snapshot.
            let guard_violations = inspect::inspect_guards_in(&mut tx).await.map_err(storage_error)?;
            let mut report = CheckReport { guard_violations, ..CheckReport::default() };
            let mut after = String::new();
            loop {
                // Only the counters and each active lease's granted and used enter
                // the equations, so only those are loaded: a row that breaks a guard
                // (a fence, say) is reported above instead of failing the check.
                let accounts: Vec<(String, i64, i64, i64, i64, i64, i64)> = sqlx::query_as(
                    "SELECT a.account_id, a.credited, a.available, a.reserved, a.consumed, a.overage, \
                 a.billed FROM tollgate_accounts a WHERE a.account_id > $1 \
                 ORDER BY a.account_id LIMIT $2",
                )
                .bind(&after)
                .bind(CHECK_PAGE_ACCOUNTS)
                .fetch_all(&mut *tx)
                .await
                .map_err(storage_error)?;
                let Some(last) = accounts.last() else { break };
                after = last.0.clone();
                let page_ids: Vec<String> = accounts.iter().map(|a| a.0.clone()).collect();
                let leases: Vec<(String, String, i64, i64)> = sqlx::query_as(
                    "SELECT l.lease_id, l.account_id, l.granted, l.used FROM tollgate_leases l \
                 WHERE l.account_id = ANY($1) AND l.state = 'active'",
                )
                .bind(&page_ids)
                .fetch_all(&mut *tx)
                .await
                .map_err(storage_error)?;
                // A negative counter breaks a column's `CHECK`; such a row is
                // reported as a guard violation (reclaim skips it too), and its
                // account's equations, which it would falsify, are not checked.
                let mut unchecked: HashSet<String> = HashSet::new();
                let mut by_account: HashMap<String, Vec<Lease>> = HashMap::new();
                for (lease_id, account_id, granted, used) in leases {
                    let negative = [("granted", granted), ("used", used)].into_iter().filter(|(_, v)| *v < 0);
                    let mut broken = false;
                    for (column, value) in negative {
                        report.guard_violations.push(negative_counter("tollgate_leases", &lease_id, column, value));
                        broken = true;
                    }
                    if broken {
                        unchecked.insert(account_id);
                        continue;
                    }
                    let lease = Lease {
                        granted: granted.unsigned_abs(),
                        used: used.unsigned_abs(),
                        lease_id: lease_id.clone(),
                        account_id: account_id.clone(),
                        state: LeaseState::Active,
                        // Not loaded; no equation reads them.
                        fencing_token: 1,
                        expiry: Timestamp::UNIX_EPOCH,
                        expiry_is_upper_bound: false,
                    };
                    by_account.entry(account_id).or_default().push(lease);
                }
                for (account_id, credited, available, reserved, consumed, overage, billed) in accounts {
                    let columns = [
                        ("credited", credited),
                        ("available", available),
                        ("reserved", reserved),
                        ("consumed", consumed),
                        ("overage", overage),
                        ("billed", billed),
                    ];
                    for (column, value) in columns.into_iter().filter(|(_, v)| *v < 0) {
                        report.guard_violations.push(negative_counter("tollgate_accounts", &account_id, column, value));
                        unchecked.insert(account_id.clone());
                    }
                    if unchecked.contains(&account_id) {
                        continue;
                    }
                    let row = AccountRow {
                        account_id,
                        credited,
                        available,
                        reserved,
                        consumed,
                        overage,
                        billed,
                        // Not loaded; no equation reads it.
                        next_fence: 1,
                    };
                    let account = row.decode()?;
                    let leases = by_account.get(&account.account_id).map(Vec::as_slice).unwrap_or(&[]);
                    report.violations.extend(check_conservation(&account, leases));
                    report.accounts_checked += 1;
                }
            }
            // The legacy-bound readiness count: leases by state and by whether their expiry is an upper bound.
            let bounds: Vec<(String, bool, i64)> = sqlx::query_as(
                "SELECT state, expiry_is_upper_bound, count(*) FROM tollgate_leases \
             GROUP BY state, expiry_is_upper_bound",
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(storage_error)?;
            let mut legacy_bounds = bounds
                .into_iter()
                .map(|(state, expiry_is_upper_bound, count)| {
                    let state =
                        LeaseState::parse(&state).ok_or_else(|| corrupt(format!("a lease has state {state:?}")))?;
                    Ok(LegacyBoundCount { state, expiry_is_upper_bound, count: count.unsigned_abs() })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            legacy_bounds.sort();
            report.legacy_bounds = legacy_bounds;
            Ok(report)
        }
        .await;
        // Read only: finishing commits nothing, it only ends the snapshot.
        finish(tx, result).await
    }

    async fn status(&self) -> Result<StorageStatus, Error> {
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
                .fetch_all(&self.pool)
                .await
                .map_err(storage_error)?;
        let known = migrations::MIGRATOR.iter().map(|m| m.version).collect();
        Ok(StorageStatus { backend: "postgres", migrations: Some(MigrationStatus { applied, known }) })
    }

    /// PostgreSQL's `clock_timestamp()`, to the microsecond it keeps.
    async fn shared_clock(&self) -> Result<Option<Timestamp>, Error> {
        let micros: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8")
            .fetch_one(&self.pool)
            .await
            .map_err(storage_error)?;
        Timestamp::from_microsecond(micros)
            .map(Some)
            .map_err(|e| corrupt(format!("PostgreSQL's clock reads {micros} µs: {e}")))
    }

    async fn pin_reclaim_grace(&self, replace: bool) -> Result<(), Error> {
        let configured = self.policy.reclaim_grace();
        if replace {
            sqlx::query(
                "INSERT INTO tollgate_settings (key, value) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()",
            )
            .bind(RECLAIM_GRACE_SETTING)
            .bind(configured.to_string())
            .execute(&self.pool)
            .await
            .map_err(storage_error)?;
            return Ok(());
        }
        // The CTE's insert is invisible to the outer SELECT of the same
        // statement, so at most one branch yields a row: the value this call
        // recorded, or the one recorded before. Neither does when another
        // server's insert was uncommitted as the statement began: the insert
        // waits for that commit and then does nothing, while the SELECT's
        // snapshot predates the commit. Running the statement again takes a
        // new snapshot, which sees that row. (An upsert that always returns
        // the row would also rewrite it on every startup.)
        let mut recorded = None;
        for _ in 0..PIN_ATTEMPTS_MAX {
            recorded = sqlx::query_scalar::<_, String>(
                "WITH inserted AS (
                     INSERT INTO tollgate_settings (key, value) VALUES ($1, $2)
                     ON CONFLICT (key) DO NOTHING
                     RETURNING value
                 )
                 SELECT value FROM inserted
                 UNION ALL
                 SELECT s.value FROM tollgate_settings s WHERE s.key = $1",
            )
            .bind(RECLAIM_GRACE_SETTING)
            .bind(configured.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(storage_error)?;
            if recorded.is_some() {
                break;
            }
        }
        let recorded = recorded.ok_or_else(|| {
            corrupt(format!("tollgate_settings {RECLAIM_GRACE_SETTING} vanished as soon as it was recorded"))
        })?;
        let recorded_grace: SignedDuration = recorded
            .parse()
            .map_err(|e| corrupt(format!("tollgate_settings {RECLAIM_GRACE_SETTING} is {recorded:?}: {e}")))?;
        if recorded_grace != configured {
            return Err(Error::ReclaimGraceMismatch { recorded, configured: configured.to_string() });
        }
        Ok(())
    }
}
