//! Alert rules, webhook endpoints, events and their deliveries: the `Outbox`
//! contract on PostgreSQL (statements in `sql/outbox.rs`).
//!
//! The memory store derives an entry's events as it journals the entry. Here
//! the statements that journal are the hot path and derive nothing:
//! `derive_events` derives later, in order. It reads the entries after each
//! account's cursor and stores their events, their deliveries and the
//! advanced cursors in one transaction, so each entry is derived exactly
//! once. One server derives at a time, under an advisory lock that the others
//! skip rather than wait for.
//!
//! Deriving late must not change what an entry emits, so each entry is judged
//! by the rules and endpoints of its time, as the memory store judges it: a
//! rule by the journal positions it existed between (`from_seq`, and
//! `deleted_seq` for a deleted rule, kept until the deriver passes it), an
//! endpoint by its creation time against the cause's (`Wanting`). A refused
//! acquire has no entry, and may come before the deriver reached the entry
//! that re-armed a rule, so a refusal reads the journal for that
//! (`REFUSAL_ACCOUNT_SQL`).
//!
//! Locks: refusals and derivations lock rules in account and then creation
//! order, and then share-lock the endpoints; deleting an endpoint locks it
//! and then its deliveries. Only creating a rule locks an account, and only
//! to insert that one rule; nothing here waits for a rule while holding an
//! account, so none of this waits in a cycle with the account writers.

use std::collections::HashMap;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use sqlx::{FromRow, PgConnection};
use tollgate_core::alerts::{ENDPOINTS_MAX, RULES_PER_ACCOUNT_MAX, refusal_events, validate_url};
use tollgate_core::{
    Account, AlertRule, COUNTER_NAMES, COUNTERS, Condition, Entry, Error, Event, EventType, InstantPair, Listing, Page,
    PageRequest,
};
use tollgate_store::{
    AttemptResult, ClaimedDelivery, Delivery, DeliveryState, Outbox, OutboxCounts, WebhookEndpoint, derive_entries,
    event_body, new_delivery_id, new_endpoint_id, new_rule_id,
};

use super::errors::{corrupt, db_i64, storable, storage_error};
use super::journal::JournalRow;
use super::load::finish;
use super::rows::AccountRow;
use super::sql::{
    CLAIM_DELIVERIES_SQL, DELETE_ENDPOINT_DELIVERIES_SQL, DELETE_ENDPOINT_SQL, DERIVE_PENDING_SQL, ENDPOINTS_LOCK_SQL,
    FINISH_DELIVERY_SQL, INSERT_ENDPOINT_SQL, INSERT_RULE_SQL, LIST_DELIVERIES_SQL, LOCK_ACCOUNT_SEQ_SQL,
    LOCK_DERIVE_RULES_SQL, LOCK_REFUSAL_RULES_SQL, OUTBOX_COUNTS_SQL, PURGE_RETIRED_RULES_SQL, READ_ENDPOINT_SQL,
    READ_ENDPOINTS_SQL, READ_RULES_SQL, REDELIVER_SQL, REFUSAL_ACCOUNT_SQL, RETIRE_RULE_SQL, ROTATE_SECRET_SQL,
    SHARE_ENDPOINTS_SQL, STORE_DERIVED_SQL, TRY_DERIVE_LOCK_SQL,
};
use super::{DOMAIN, Engine, PostgresStore};

// ------------------------------------------------------------------ decoding

fn instant(what: &str, floor_us: i64, submicro_ns: i16) -> Result<Timestamp, Error> {
    InstantPair::decode(floor_us, i64::from(submicro_ns)).map_err(|error| corrupt(format!("{what}: {error}")))
}

fn optional_instant(what: &str, floor_us: Option<i64>, submicro_ns: Option<i16>) -> Result<Option<Timestamp>, Error> {
    match (floor_us, submicro_ns) {
        (None, None) => Ok(None),
        (Some(floor_us), Some(submicro_ns)) => instant(what, floor_us, submicro_ns).map(Some),
        _ => Err(corrupt(format!("{what} has only one of its two columns"))),
    }
}

/// A stored value the core holds as `u64` (a sequence number, a threshold).
fn nonnegative(what: &str, value: i64) -> Result<u64, Error> {
    u64::try_from(value).map_err(|_| corrupt(format!("{what} is {value}")))
}

fn event_types(what: &str, names: &[String]) -> Result<Vec<EventType>, Error> {
    names
        .iter()
        .map(|name| EventType::parse(name).ok_or_else(|| corrupt(format!("{what}: event type {name:?}"))))
        .collect()
}

/// A count bound (`RULES_PER_ACCOUNT_MAX`, `ENDPOINTS_MAX`, a page's rows)
/// as a `BIGINT` parameter.
fn bound(max: usize) -> i64 {
    i64::try_from(max).unwrap_or(i64::MAX)
}

#[derive(FromRow)]
struct RuleRow {
    account_id: String,
    rule_id: String,
    kind: String,
    threshold: Option<i64>,
    created_floor_us: i64,
    created_submicro_ns: i16,
    from_seq: i64,
    refused_at_seq: Option<i64>,
    deleted_seq: Option<i64>,
}

/// A rule as the deriver judges entries by it: deleted rules judge the
/// entries up to their deletion.
struct StoredRule {
    rule: AlertRule,
    deleted_seq: Option<u64>,
}

impl StoredRule {
    /// Whether the rule existed when entry `seq` was made (its creation is
    /// `AlertRule::from_seq`'s concern).
    fn judges(&self, seq: u64) -> bool {
        self.deleted_seq.is_none_or(|deleted| seq <= deleted)
    }
}

impl RuleRow {
    fn stored(self) -> Result<StoredRule, Error> {
        let deleted_seq = self
            .deleted_seq
            .map(|seq| nonnegative(&format!("alert rule {}/{}: deleted_seq", self.account_id, self.rule_id), seq))
            .transpose()?;
        Ok(StoredRule { rule: self.decode()?, deleted_seq })
    }

    fn decode(self) -> Result<AlertRule, Error> {
        let what = format!("alert rule {}/{}", self.account_id, self.rule_id);
        let threshold = self.threshold.map(|value| nonnegative(&format!("{what}: threshold"), value)).transpose()?;
        let condition = Condition::parse(&self.kind, threshold)
            .map_err(|_| corrupt(format!("{what}: kind {:?} with threshold {:?}", self.kind, self.threshold)))?;
        let created_at = instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?;
        let from_seq = nonnegative(&format!("{what}: from_seq"), self.from_seq)?;
        let refused_at_seq =
            self.refused_at_seq.map(|seq| nonnegative(&format!("{what}: refused_at_seq"), seq)).transpose()?;
        Ok(AlertRule {
            rule_id: self.rule_id,
            account_id: self.account_id,
            condition,
            created_at,
            from_seq,
            refused_at_seq,
        })
    }
}

#[derive(FromRow)]
struct EndpointRow {
    endpoint_id: String,
    url: String,
    event_types: Vec<String>,
    created_floor_us: i64,
    created_submicro_ns: i16,
    rotated_floor_us: Option<i64>,
    rotated_submicro_ns: Option<i16>,
    previous_secret_until_floor_us: Option<i64>,
    previous_secret_until_submicro_ns: Option<i16>,
}

impl EndpointRow {
    fn decode(self) -> Result<WebhookEndpoint, Error> {
        let what = format!("webhook endpoint {}", self.endpoint_id);
        Ok(WebhookEndpoint {
            event_types: event_types(&what, &self.event_types)?,
            created_at: instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?,
            rotated_at: optional_instant(&format!("{what}: rotated"), self.rotated_floor_us, self.rotated_submicro_ns)?,
            previous_secret_until: optional_instant(
                &format!("{what}: previous_secret_until"),
                self.previous_secret_until_floor_us,
                self.previous_secret_until_submicro_ns,
            )?,
            endpoint_id: self.endpoint_id,
            url: self.url,
        })
    }
}

/// An endpoint as fanning out needs it: which event types it asks for, and
/// since when (`alerts::endpoint_wants`: derivation here may come long after
/// the cause, the memory store's never does, and both send the same events).
struct Wanting {
    endpoint_id: String,
    event_types: Vec<EventType>,
    created_at: Timestamp,
}

impl Wanting {
    fn wants(&self, event: &Event) -> bool {
        tollgate_core::alerts::endpoint_wants(&self.event_types, self.created_at, event)
    }
}

#[derive(FromRow)]
struct WantingRow {
    endpoint_id: String,
    event_types: Vec<String>,
    created_floor_us: i64,
    created_submicro_ns: i16,
}

#[derive(FromRow)]
struct DeliveryRow {
    account_id: String,
    delivery_id: String,
    endpoint_id: String,
    event_id: String,
    event_type: String,
    state: String,
    attempts: i32,
    next_attempt_floor_us: Option<i64>,
    next_attempt_submicro_ns: Option<i16>,
    last_error: Option<String>,
    last_status: Option<i32>,
    created_floor_us: i64,
    created_submicro_ns: i16,
    delivered_floor_us: Option<i64>,
    delivered_submicro_ns: Option<i16>,
}

impl DeliveryRow {
    fn decode(self) -> Result<Delivery, Error> {
        let what = format!("webhook delivery {}", self.delivery_id);
        let bad = |detail: String| corrupt(format!("{what}: {detail}"));
        let state = DeliveryState::parse(&self.state).ok_or_else(|| bad(format!("state {:?}", self.state)))?;
        let event_type =
            EventType::parse(&self.event_type).ok_or_else(|| bad(format!("event type {:?}", self.event_type)))?;
        let attempts = u32::try_from(self.attempts).map_err(|_| bad(format!("attempts is {}", self.attempts)))?;
        let last_status = self
            .last_status
            .map(|status| u16::try_from(status).map_err(|_| bad(format!("last_status is {status}"))))
            .transpose()?;
        let next_attempt_at = optional_instant(
            &format!("{what}: next attempt"),
            self.next_attempt_floor_us,
            self.next_attempt_submicro_ns,
        )?;
        Ok(Delivery {
            state,
            event_type,
            attempts,
            // Only a pending delivery is due again.
            next_attempt_at: next_attempt_at.filter(|_| state == DeliveryState::Pending),
            last_status,
            created_at: instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?,
            delivered_at: optional_instant(
                &format!("{what}: delivered"),
                self.delivered_floor_us,
                self.delivered_submicro_ns,
            )?,
            last_error: self.last_error,
            delivery_id: self.delivery_id,
            endpoint_id: self.endpoint_id,
            event_id: self.event_id,
            account_id: self.account_id,
        })
    }
}

/// A claimed delivery with what its attempt sends. Holds sealed secrets:
/// deliberately not `Debug`.
#[derive(FromRow)]
struct ClaimRow {
    delivery_id: String,
    endpoint_id: String,
    event_id: String,
    attempts: i32,
    created_floor_us: i64,
    created_submicro_ns: i16,
    url: String,
    secret: Vec<u8>,
    previous_secret: Option<Vec<u8>>,
    body: String,
}

impl ClaimRow {
    fn decode(self) -> Result<ClaimedDelivery, Error> {
        let what = format!("webhook delivery {}", self.delivery_id);
        let attempt =
            u32::try_from(self.attempts).map_err(|_| corrupt(format!("{what}: attempts is {}", self.attempts)))?;
        Ok(ClaimedDelivery {
            attempt,
            created_at: instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?,
            sealed_secrets: std::iter::once(self.secret).chain(self.previous_secret).collect(),
            delivery_id: self.delivery_id,
            endpoint_id: self.endpoint_id,
            event_id: self.event_id,
            url: self.url,
            body: self.body,
        })
    }
}

/// A journal entry not yet derived, with its account's cursor.
#[derive(FromRow)]
struct PendingRow {
    cursor_seq: Option<i64>,
    cursor_counters: Option<Vec<i64>>,
    #[sqlx(flatten)]
    entry: JournalRow,
}

/// An account's entries to derive, and its counters before the first.
struct PendingAccount {
    account_id: String,
    before: [u64; COUNTERS],
    /// The sequence number of the last entry here, or the cursor's.
    seq: u64,
    entries: Vec<Entry>,
}

impl PendingAccount {
    /// An account at its cursor: none means an account created after
    /// migration 0024, whose journal is complete from entry 1, so it starts
    /// from a new account's counters.
    fn at_cursor(account_id: &str, seq: Option<i64>, counters: Option<Vec<i64>>) -> Result<Self, Error> {
        let what = format!("outbox cursor of account {account_id}");
        let (seq, before) = match (seq, counters) {
            (None, _) => (0, Account::new(account_id.to_owned()).counters()),
            (Some(seq), Some(values)) if values.len() == COUNTERS => {
                let mut before = [0; COUNTERS];
                for ((slot, value), name) in before.iter_mut().zip(values).zip(COUNTER_NAMES) {
                    *slot = nonnegative(&format!("{what}: {name}"), value)?;
                }
                (nonnegative(&format!("{what}: seq"), seq)?, before)
            }
            (Some(_), _) => return Err(corrupt(format!("{what}: the counters are not all there"))),
        };
        Ok(Self { account_id: account_id.to_owned(), before, seq, entries: Vec::new() })
    }

    /// Adds the next entry; `derive_entries` needs them consecutive.
    fn push(&mut self, entry: Entry) -> Result<(), Error> {
        if entry.seq != self.seq + 1 {
            return Err(corrupt(format!(
                "journal of account {}: entry {} follows entry {}",
                self.account_id, entry.seq, self.seq
            )));
        }
        self.seq = entry.seq;
        self.entries.push(entry);
        Ok(())
    }
}

/// The rows of `DERIVE_PENDING_SQL`, by account.
fn by_account(rows: Vec<PendingRow>) -> Result<Vec<PendingAccount>, Error> {
    let mut accounts: Vec<PendingAccount> = Vec::new();
    for row in rows {
        let entry = row.entry.decode()?;
        if accounts.last().is_none_or(|account| account.account_id != entry.account_id) {
            accounts.push(PendingAccount::at_cursor(&entry.account_id, row.cursor_seq, row.cursor_counters)?);
        }
        if let Some(account) = accounts.last_mut() {
            account.push(entry)?;
        }
    }
    Ok(accounts)
}

// ------------------------------------------------------------------- storing

/// What a derivation or a refusal stores: the parallel arrays
/// `STORE_DERIVED_SQL` binds, one per column.
#[derive(Default)]
struct Outgoing {
    events: EventColumns,
    deliveries: DeliveryColumns,
    cursors: CursorColumns,
    rules: RuleColumns,
}

#[derive(Default)]
struct EventColumns {
    account_ids: Vec<String>,
    event_ids: Vec<String>,
    event_types: Vec<&'static str>,
    bodies: Vec<String>,
    floor_us: Vec<i64>,
    submicro_ns: Vec<i16>,
}

#[derive(Default)]
struct DeliveryColumns {
    account_ids: Vec<String>,
    delivery_ids: Vec<String>,
    endpoint_ids: Vec<String>,
    event_ids: Vec<String>,
    event_types: Vec<&'static str>,
    floor_us: Vec<i64>,
    submicro_ns: Vec<i16>,
}

#[derive(Default)]
struct CursorColumns {
    account_ids: Vec<String>,
    seqs: Vec<i64>,
    /// One column per counter, in `COUNTER_NAMES` order.
    counters: [Vec<i64>; COUNTERS],
}

#[derive(Default)]
struct RuleColumns {
    account_ids: Vec<String>,
    rule_ids: Vec<String>,
    refused_at_seqs: Vec<Option<i64>>,
    /// The deleted rules to remove, apart from the changed ones above.
    purged_account_ids: Vec<String>,
    purged_rule_ids: Vec<String>,
}

impl Outgoing {
    /// Keeps `event` with one pending delivery, due when the event happened,
    /// per endpoint that wants it, if any does.
    fn fan_out(&mut self, event: &Event, endpoints: &[Wanting]) {
        let wanting: Vec<&Wanting> = endpoints.iter().filter(|endpoint| endpoint.wants(event)).collect();
        if wanting.is_empty() {
            return;
        }
        let at = InstantPair::encode(event.at);
        let events = &mut self.events;
        events.account_ids.push(event.account_id.clone());
        events.event_ids.push(event.event_id.clone());
        events.event_types.push(event.event_type.as_str());
        events.bodies.push(event_body(event));
        events.floor_us.push(at.floor_us);
        events.submicro_ns.push(at.submicro_ns);
        let deliveries = &mut self.deliveries;
        for endpoint in wanting {
            deliveries.account_ids.push(event.account_id.clone());
            deliveries.delivery_ids.push(new_delivery_id(event.at));
            deliveries.endpoint_ids.push(endpoint.endpoint_id.clone());
            deliveries.event_ids.push(event.event_id.clone());
            deliveries.event_types.push(event.event_type.as_str());
            deliveries.floor_us.push(at.floor_us);
            deliveries.submicro_ns.push(at.submicro_ns);
        }
    }

    /// Moves `account_id`'s cursor to entry `seq`, after which its counters
    /// are `counters`.
    fn cursor(&mut self, account_id: &str, seq: u64, counters: &[u64; COUNTERS]) -> Result<(), Error> {
        let cursors = &mut self.cursors;
        cursors.account_ids.push(account_id.to_owned());
        cursors.seqs.push(db_i64(seq, "journal_seq")?);
        for ((column, value), name) in cursors.counters.iter_mut().zip(counters).zip(COUNTER_NAMES) {
            column.push(db_i64(*value, name)?);
        }
        Ok(())
    }

    /// Removes a deleted rule that judges no entry left to derive.
    fn purge(&mut self, rule: &AlertRule) {
        self.rules.purged_account_ids.push(rule.account_id.clone());
        self.rules.purged_rule_ids.push(rule.rule_id.clone());
    }

    /// Writes `rule`'s `refused_at_seq`.
    fn rule(&mut self, rule: &AlertRule) -> Result<(), Error> {
        let refused_at_seq = rule.refused_at_seq.map(|seq| db_i64(seq, "refused_at_seq")).transpose()?;
        self.rules.account_ids.push(rule.account_id.clone());
        self.rules.rule_ids.push(rule.rule_id.clone());
        self.rules.refused_at_seqs.push(refused_at_seq);
        Ok(())
    }

    async fn store(self, conn: &mut PgConnection) -> Result<(), Error> {
        let Self { events: e, deliveries: d, cursors: c, rules: r } = self;
        let [credited, available, reserved, consumed, overage, billed, next_fence] = c.counters;
        sqlx::query(STORE_DERIVED_SQL)
            .bind(e.account_ids)
            .bind(e.event_ids)
            .bind(e.event_types)
            .bind(e.bodies)
            .bind(e.floor_us)
            .bind(e.submicro_ns)
            .bind(d.account_ids)
            .bind(d.delivery_ids)
            .bind(d.endpoint_ids)
            .bind(d.event_ids)
            .bind(d.event_types)
            .bind(d.floor_us)
            .bind(d.submicro_ns)
            .bind(c.account_ids)
            .bind(c.seqs)
            .bind(credited)
            .bind(available)
            .bind(reserved)
            .bind(consumed)
            .bind(overage)
            .bind(billed)
            .bind(next_fence)
            .bind(r.account_ids)
            .bind(r.rule_ids)
            .bind(r.refused_at_seqs)
            .bind(r.purged_account_ids)
            .bind(r.purged_rule_ids)
            .execute(&mut *conn)
            .await
            .map_err(storage_error)?;
        Ok(())
    }
}

/// Every endpoint's id and event types, share-locked until the transaction
/// ends, so that one deleted meanwhile takes the deliveries made for it along.
async fn share_endpoints(conn: &mut PgConnection) -> Result<Vec<Wanting>, Error> {
    let rows: Vec<WantingRow> =
        sqlx::query_as(SHARE_ENDPOINTS_SQL).fetch_all(&mut *conn).await.map_err(storage_error)?;
    rows.into_iter()
        .map(|row| {
            let what = format!("webhook endpoint {}", row.endpoint_id);
            let event_types = event_types(&what, &row.event_types)?;
            let created_at = instant(&format!("{what}: created"), row.created_floor_us, row.created_submicro_ns)?;
            Ok(Wanting { endpoint_id: row.endpoint_id, event_types, created_at })
        })
        .collect()
}

// ------------------------------------------------------------------ deriving

/// Derives up to `limit` entries in the caller's transaction; 0 when another
/// server is deriving.
async fn derive_in(conn: &mut PgConnection, limit: u32) -> Result<u32, Error> {
    let granted: bool = sqlx::query_scalar(TRY_DERIVE_LOCK_SQL).fetch_one(&mut *conn).await.map_err(storage_error)?;
    if !granted {
        return Ok(0);
    }
    let rows: Vec<PendingRow> =
        sqlx::query_as(DERIVE_PENDING_SQL).bind(i64::from(limit)).fetch_all(&mut *conn).await.map_err(storage_error)?;
    let accounts = by_account(rows)?;
    if accounts.is_empty() {
        return Ok(0);
    }
    let account_ids: Vec<&str> = accounts.iter().map(|account| account.account_id.as_str()).collect();
    let rule_rows: Vec<RuleRow> =
        sqlx::query_as(LOCK_DERIVE_RULES_SQL).bind(account_ids).fetch_all(&mut *conn).await.map_err(storage_error)?;
    let mut rules: HashMap<String, Vec<StoredRule>> = HashMap::new();
    for row in rule_rows {
        let stored = row.stored()?;
        rules.entry(stored.rule.account_id.clone()).or_default().push(stored);
    }
    let endpoints = share_endpoints(conn).await?;
    let mut outgoing = Outgoing::default();
    let mut derived = 0usize;
    for account in accounts {
        derived += account.entries.len();
        let account_rules = rules.remove(&account.account_id).unwrap_or_default();
        derive_account(&mut outgoing, account, account_rules, &endpoints)?;
    }
    outgoing.store(conn).await?;
    Ok(u32::try_from(derived).unwrap_or(u32::MAX))
}

/// Derives one account's entries, each under the rules that existed when it
/// was made: their events fan out, its cursor moves past them, the rules
/// they re-armed are written, and the deleted rules they were the last
/// entries of are removed.
fn derive_account(
    outgoing: &mut Outgoing,
    account: PendingAccount,
    mut rules: Vec<StoredRule>,
    endpoints: &[Wanting],
) -> Result<(), Error> {
    let armed_before: Vec<Option<u64>> = rules.iter().map(|stored| stored.rule.refused_at_seq).collect();
    let mut counters = account.before;
    for entry in &account.entries {
        let mut judging: Vec<AlertRule> =
            rules.iter().filter(|stored| stored.judges(entry.seq)).map(|stored| stored.rule.clone()).collect();
        let (after, events) = derive_entries(&mut judging, counters, std::slice::from_ref(entry))?;
        for event in &events {
            outgoing.fan_out(event, endpoints);
        }
        for judged in judging {
            if let Some(stored) = rules.iter_mut().find(|stored| stored.rule.rule_id == judged.rule_id) {
                stored.rule.refused_at_seq = judged.refused_at_seq;
            }
        }
        counters = after;
    }
    outgoing.cursor(&account.account_id, account.seq, &counters)?;
    for (stored, before) in rules.iter().zip(armed_before) {
        if !stored.judges(account.seq + 1) {
            outgoing.purge(&stored.rule);
        } else if stored.rule.refused_at_seq != before {
            outgoing.rule(&stored.rule)?;
        }
    }
    Ok(())
}

// ----------------------------------------------------------------- refusals

/// The account at a refusal: its counters, journal sequence number and the
/// fired rules the journal re-armed since.
#[derive(FromRow)]
struct RefusalRow {
    #[sqlx(flatten)]
    account: AccountRow,
    journal_seq: i64,
    rearmed: Vec<String>,
}

/// Fires the armed `acquire_refused` rules of `account_id` in the caller's
/// transaction; returns how many fired.
async fn refuse_in(conn: &mut PgConnection, account_id: &str, now: Timestamp) -> Result<u32, Error> {
    let rule_rows: Vec<RuleRow> =
        sqlx::query_as(LOCK_REFUSAL_RULES_SQL).bind(account_id).fetch_all(&mut *conn).await.map_err(storage_error)?;
    let row: Option<RefusalRow> =
        sqlx::query_as(REFUSAL_ACCOUNT_SQL).bind(account_id).fetch_optional(&mut *conn).await.map_err(storage_error)?;
    let row = row.ok_or(Error::AccountNotFound)?;
    let seq = nonnegative(&format!("account {account_id}: journal_seq"), row.journal_seq)?;
    let counters = row.account.decode()?.counters();
    let mut rules = rule_rows.into_iter().map(RuleRow::decode).collect::<Result<Vec<_>, _>>()?;
    for rule in rules.iter_mut().filter(|rule| row.rearmed.contains(&rule.rule_id)) {
        rule.refused_at_seq = None;
    }
    // Only the nonce's uniqueness matters: a fresh rule id's random bits.
    let events = refusal_events(&rules, account_id, seq, &counters, now, &new_rule_id());
    if events.is_empty() {
        return Ok(0);
    }
    let endpoints = share_endpoints(conn).await?;
    let mut outgoing = Outgoing::default();
    for event in &events {
        outgoing.fan_out(event, &endpoints);
    }
    for rule in rules.iter_mut().filter(|rule| events.iter().any(|e| e.rule_id.as_ref() == Some(&rule.rule_id))) {
        rule.refused_at_seq = Some(seq);
        outgoing.rule(rule)?;
    }
    outgoing.store(conn).await?;
    Ok(u32::try_from(events.len()).unwrap_or(u32::MAX))
}

// ---------------------------------------------------------------- attempts

/// An attempt's result as the delivery's columns record it.
struct Finished {
    state: DeliveryState,
    next_attempt: Option<InstantPair>,
    error: Option<String>,
    status: Option<u16>,
    delivered: Option<InstantPair>,
}

impl Finished {
    fn of(result: AttemptResult, now: Timestamp) -> Self {
        // PostgreSQL text cannot hold NUL, which an error message could.
        let text = |error: String| Some(error.replace('\0', "\u{fffd}"));
        match result {
            AttemptResult::Delivered { status } => Self {
                state: DeliveryState::Delivered,
                next_attempt: None,
                error: None,
                status: Some(status),
                delivered: Some(InstantPair::encode(now)),
            },
            AttemptResult::Retry { at, error, status } => Self {
                state: DeliveryState::Pending,
                next_attempt: Some(InstantPair::encode(at)),
                error: text(error),
                status,
                delivered: None,
            },
            AttemptResult::Failed { error, status } => {
                Self { state: DeliveryState::Failed, next_attempt: None, error: text(error), status, delivered: None }
            }
        }
    }
}

// ---------------------------------------------------------------- the engine

impl Engine {
    async fn create_rule(&self, account_id: &str, condition: Condition, now: Timestamp) -> Result<AlertRule, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        // A threshold in units beyond the unit domain is refused as units
        // are; a percent is always within it.
        let threshold = condition.threshold().map(|units| DOMAIN.check(units)).transpose()?;
        let threshold = threshold.map(|units| db_i64(units, "threshold")).transpose()?;
        let (rule_id, created) = (new_rule_id(), InstantPair::encode(now));
        let mut tx = self.begin().await?;
        let result = async {
            let journal_seq: Option<i64> = sqlx::query_scalar(LOCK_ACCOUNT_SEQ_SQL)
                .bind(account_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(storage_error)?;
            let journal_seq = journal_seq.ok_or(Error::AccountNotFound)?;
            let inserted: Option<String> = sqlx::query_scalar(INSERT_RULE_SQL)
                .bind(account_id)
                .bind(&rule_id)
                .bind(condition.kind())
                .bind(threshold)
                .bind(created.floor_us)
                .bind(created.submicro_ns)
                .bind(journal_seq)
                .bind(bound(RULES_PER_ACCOUNT_MAX))
                .fetch_optional(&mut *tx)
                .await
                .map_err(storage_error)?;
            inserted.ok_or(Error::TooManyRules { max: RULES_PER_ACCOUNT_MAX })?;
            Ok(AlertRule {
                rule_id: rule_id.clone(),
                account_id: account_id.to_owned(),
                condition,
                created_at: now,
                from_seq: nonnegative(&format!("account {account_id}: journal_seq"), journal_seq)?,
                refused_at_seq: None,
            })
        }
        .await;
        finish(tx, result).await
    }

    async fn rules_of(&self, account_id: &str) -> Result<Vec<AlertRule>, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let rows: Vec<RuleRow> =
            sqlx::query_as(READ_RULES_SQL).bind(account_id).fetch_all(&self.pool).await.map_err(storage_error)?;
        self.existing(account_id, rows.len()).await?;
        rows.into_iter().map(RuleRow::decode).collect()
    }

    async fn delete_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        if storable(rule_id) && self.retire_rule(account_id, rule_id).await? {
            return Ok(());
        }
        self.existing(account_id, 0).await?;
        Err(Error::RuleNotFound)
    }

    /// Deletes the rule as of the account's current entry, and removes it
    /// (with any other deleted rule) at once when no entry it judges is left
    /// to derive. Whether there was such a rule.
    async fn retire_rule(&self, account_id: &str, rule_id: &str) -> Result<bool, Error> {
        let mut tx = self.begin().await?;
        let result = async {
            let retired: Option<String> = sqlx::query_scalar(RETIRE_RULE_SQL)
                .bind(account_id)
                .bind(rule_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(storage_error)?;
            if retired.is_none() {
                return Ok(false);
            }
            sqlx::query(PURGE_RETIRED_RULES_SQL).bind(account_id).execute(&mut *tx).await.map_err(storage_error)?;
            Ok(true)
        }
        .await;
        finish(tx, result).await
    }

    async fn add_endpoint(
        &self,
        url: &str,
        types: &[EventType],
        sealed_secret: Vec<u8>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        validate_url(url)?;
        if types.is_empty() {
            return Err(Error::InvalidEventTypes);
        }
        let endpoint_id = new_endpoint_id();
        let names: Vec<&str> = types.iter().map(|kind| kind.as_str()).collect();
        let created = InstantPair::encode(now);
        let mut tx = self.begin().await?;
        let result = async {
            sqlx::query(ENDPOINTS_LOCK_SQL).execute(&mut *tx).await.map_err(storage_error)?;
            let inserted: Option<String> = sqlx::query_scalar(INSERT_ENDPOINT_SQL)
                .bind(&endpoint_id)
                .bind(url)
                .bind(names)
                .bind(sealed_secret)
                .bind(created.floor_us)
                .bind(created.submicro_ns)
                .bind(bound(ENDPOINTS_MAX))
                .fetch_optional(&mut *tx)
                .await
                .map_err(storage_error)?;
            inserted.ok_or(Error::TooManyEndpoints { max: ENDPOINTS_MAX })?;
            Ok(WebhookEndpoint {
                endpoint_id: endpoint_id.clone(),
                url: url.to_owned(),
                event_types: types.to_vec(),
                created_at: now,
                rotated_at: None,
                previous_secret_until: None,
            })
        }
        .await;
        finish(tx, result).await
    }

    async fn all_endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        let rows: Vec<EndpointRow> =
            sqlx::query_as(READ_ENDPOINTS_SQL).fetch_all(&self.pool).await.map_err(storage_error)?;
        rows.into_iter().map(EndpointRow::decode).collect()
    }

    async fn remove_endpoint(&self, endpoint_id: &str) -> Result<(), Error> {
        if !storable(endpoint_id) {
            return Err(Error::EndpointNotFound);
        }
        let mut tx = self.begin().await?;
        let result = async {
            let deleted =
                sqlx::query(DELETE_ENDPOINT_SQL).bind(endpoint_id).execute(&mut *tx).await.map_err(storage_error)?;
            if deleted.rows_affected() == 0 {
                return Err(Error::EndpointNotFound);
            }
            sqlx::query(DELETE_ENDPOINT_DELIVERIES_SQL)
                .bind(endpoint_id)
                .execute(&mut *tx)
                .await
                .map_err(storage_error)?;
            Ok(())
        }
        .await;
        finish(tx, result).await
    }

    async fn rotate_secret(
        &self,
        endpoint_id: &str,
        sealed_secret: Vec<u8>,
        previous_until: Timestamp,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        if !storable(endpoint_id) {
            return Err(Error::EndpointNotFound);
        }
        let (until, rotated) = (InstantPair::encode(previous_until), InstantPair::encode(now));
        let row: Option<EndpointRow> = sqlx::query_as(ROTATE_SECRET_SQL)
            .bind(endpoint_id)
            .bind(sealed_secret)
            .bind(until.floor_us)
            .bind(until.submicro_ns)
            .bind(rotated.floor_us)
            .bind(rotated.submicro_ns)
            .fetch_optional(&self.pool)
            .await
            .map_err(storage_error)?;
        row.ok_or(Error::EndpointNotFound)?.decode()
    }

    async fn refuse(&self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let mut tx = self.begin().await?;
        let result = refuse_in(&mut tx, account_id, now).await;
        finish(tx, result).await
    }

    async fn derive(&self, limit: u32) -> Result<u32, Error> {
        if limit == 0 {
            return Ok(0);
        }
        let mut tx = self.begin().await?;
        let result = derive_in(&mut tx, limit).await;
        finish(tx, result).await
    }

    async fn claim(
        &self,
        now: Timestamp,
        limit: u32,
        claim_for: SignedDuration,
        skip: &[String],
    ) -> Result<Vec<ClaimedDelivery>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // An id PostgreSQL cannot store names no endpoint.
        let skip: Vec<&str> = skip.iter().map(String::as_str).filter(|id| storable(id)).collect();
        let at = InstantPair::encode(now);
        let lapses = InstantPair::encode(now.checked_add(claim_for).unwrap_or(Timestamp::MAX));
        let rows: Vec<ClaimRow> = sqlx::query_as(CLAIM_DELIVERIES_SQL)
            .bind(at.floor_us)
            .bind(at.submicro_ns)
            .bind(i64::from(limit))
            .bind(lapses.floor_us)
            .bind(lapses.submicro_ns)
            .bind(skip)
            .fetch_all(&self.pool)
            .await
            .map_err(storage_error)?;
        rows.into_iter().map(ClaimRow::decode).collect()
    }

    async fn finish_attempt(
        &self,
        delivery_id: &str,
        attempt: u32,
        result: AttemptResult,
        now: Timestamp,
    ) -> Result<bool, Error> {
        // No stored delivery has such an id, or so many attempts.
        let Ok(attempt) = i32::try_from(attempt) else { return Ok(false) };
        if !storable(delivery_id) {
            return Ok(false);
        }
        let finished = Finished::of(result, now);
        let updated = sqlx::query(FINISH_DELIVERY_SQL)
            .bind(delivery_id)
            .bind(attempt)
            .bind(finished.state.as_str())
            .bind(finished.next_attempt.map(|at| at.floor_us))
            .bind(finished.next_attempt.map(|at| at.submicro_ns))
            .bind(finished.error)
            .bind(finished.status.map(i32::from))
            .bind(finished.delivered.map(|at| at.floor_us))
            .bind(finished.delivered.map(|at| at.submicro_ns))
            .execute(&self.pool)
            .await
            .map_err(storage_error)?;
        Ok(updated.rows_affected() > 0)
    }

    async fn deliveries_page(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        let listing = Listing::deliveries(endpoint_id, page)?;
        if !storable(endpoint_id) {
            return Err(Error::EndpointNotFound);
        }
        let rows: Vec<DeliveryRow> = sqlx::query_as(LIST_DELIVERIES_SQL)
            .bind(endpoint_id)
            .bind(listing.after().unwrap_or(""))
            .bind(bound(listing.fetch()))
            .fetch_all(&self.pool)
            .await
            .map_err(storage_error)?;
        // An endpoint's deliveries are deleted with it, so only an empty
        // page may mean an unknown endpoint.
        if rows.is_empty() {
            let found: Option<String> = sqlx::query_scalar(READ_ENDPOINT_SQL)
                .bind(endpoint_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(storage_error)?;
            found.ok_or(Error::EndpointNotFound)?;
        }
        let deliveries = rows.into_iter().map(DeliveryRow::decode).collect::<Result<Vec<_>, _>>()?;
        Ok(listing.page(deliveries, |delivery| delivery.delivery_id.as_str()))
    }

    async fn deliver_again(&self, endpoint_id: &str, delivery_id: &str, now: Timestamp) -> Result<Delivery, Error> {
        if !storable(endpoint_id) || !storable(delivery_id) {
            return Err(Error::DeliveryNotFound);
        }
        let due = InstantPair::encode(now);
        let row: Option<DeliveryRow> = sqlx::query_as(REDELIVER_SQL)
            .bind(endpoint_id)
            .bind(delivery_id)
            .bind(due.floor_us)
            .bind(due.submicro_ns)
            .fetch_optional(&self.pool)
            .await
            .map_err(storage_error)?;
        row.ok_or(Error::DeliveryNotFound)?.decode()
    }

    async fn counts(&self) -> Result<OutboxCounts, Error> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as(OUTBOX_COUNTS_SQL).fetch_all(&self.pool).await.map_err(storage_error)?;
        let mut counts = OutboxCounts::default();
        for (state, deliveries) in rows {
            let deliveries = nonnegative("webhook deliveries", deliveries)?;
            match DeliveryState::parse(&state) {
                Some(DeliveryState::Pending) => counts.pending = deliveries,
                Some(DeliveryState::Delivered) => counts.delivered = deliveries,
                Some(DeliveryState::Failed) => counts.failed = deliveries,
                None => return Err(corrupt(format!("webhook deliveries in state {state:?}"))),
            }
        }
        Ok(counts)
    }
}

/// Each operation in one line, on the engine.
#[async_trait]
impl Outbox for Engine {
    async fn create_alert_rule(
        &self,
        account_id: &str,
        condition: Condition,
        now: Timestamp,
    ) -> Result<AlertRule, Error> {
        self.create_rule(account_id, condition, now).await
    }

    async fn alert_rules(&self, account_id: &str) -> Result<Vec<AlertRule>, Error> {
        self.rules_of(account_id).await
    }

    async fn delete_alert_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error> {
        self.delete_rule(account_id, rule_id).await
    }

    async fn create_endpoint(
        &self,
        url: &str,
        event_types: &[EventType],
        sealed_secret: Vec<u8>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        self.add_endpoint(url, event_types, sealed_secret, now).await
    }

    async fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        self.all_endpoints().await
    }

    async fn delete_endpoint(&self, endpoint_id: &str) -> Result<(), Error> {
        self.remove_endpoint(endpoint_id).await
    }

    async fn rotate_endpoint_secret(
        &self,
        endpoint_id: &str,
        sealed_secret: Vec<u8>,
        previous_until: Timestamp,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        self.rotate_secret(endpoint_id, sealed_secret, previous_until, now).await
    }

    async fn note_refusal(&self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        self.refuse(account_id, now).await
    }

    async fn derive_events(&self, limit: u32) -> Result<u32, Error> {
        self.derive(limit).await
    }

    async fn claim_deliveries(
        &self,
        now: Timestamp,
        limit: u32,
        claim_for: SignedDuration,
        skip: &[String],
    ) -> Result<Vec<ClaimedDelivery>, Error> {
        self.claim(now, limit, claim_for, skip).await
    }

    async fn finish_delivery(
        &self,
        delivery_id: &str,
        attempt: u32,
        result: AttemptResult,
        now: Timestamp,
    ) -> Result<bool, Error> {
        self.finish_attempt(delivery_id, attempt, result, now).await
    }

    async fn deliveries(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        self.deliveries_page(endpoint_id, page).await
    }

    async fn redeliver(&self, endpoint_id: &str, delivery_id: &str, now: Timestamp) -> Result<Delivery, Error> {
        self.deliver_again(endpoint_id, delivery_id, now).await
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, Error> {
        self.counts().await
    }
}

/// Each operation runs to completion in a task of its own (`complete`), like
/// every other operation of the store.
#[async_trait]
impl Outbox for PostgresStore {
    async fn create_alert_rule(
        &self,
        account_id: &str,
        condition: Condition,
        now: Timestamp,
    ) -> Result<AlertRule, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.create_alert_rule(&account_id, condition, now).await }).await
    }

    async fn alert_rules(&self, account_id: &str) -> Result<Vec<AlertRule>, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.alert_rules(&account_id).await }).await
    }

    async fn delete_alert_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error> {
        let (account_id, rule_id) = (account_id.to_owned(), rule_id.to_owned());
        self.complete(move |e| async move { e.delete_alert_rule(&account_id, &rule_id).await }).await
    }

    async fn create_endpoint(
        &self,
        url: &str,
        event_types: &[EventType],
        sealed_secret: Vec<u8>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        let (url, event_types) = (url.to_owned(), event_types.to_vec());
        self.complete(move |e| async move { e.create_endpoint(&url, &event_types, sealed_secret, now).await }).await
    }

    async fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        self.complete(move |e| async move { e.endpoints().await }).await
    }

    async fn delete_endpoint(&self, endpoint_id: &str) -> Result<(), Error> {
        let endpoint_id = endpoint_id.to_owned();
        self.complete(move |e| async move { e.delete_endpoint(&endpoint_id).await }).await
    }

    async fn rotate_endpoint_secret(
        &self,
        endpoint_id: &str,
        sealed_secret: Vec<u8>,
        previous_until: Timestamp,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        let endpoint_id = endpoint_id.to_owned();
        self.complete(move |e| async move {
            e.rotate_endpoint_secret(&endpoint_id, sealed_secret, previous_until, now).await
        })
        .await
    }

    async fn note_refusal(&self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.note_refusal(&account_id, now).await }).await
    }

    async fn derive_events(&self, limit: u32) -> Result<u32, Error> {
        self.complete(move |e| async move { e.derive_events(limit).await }).await
    }

    async fn claim_deliveries(
        &self,
        now: Timestamp,
        limit: u32,
        claim_for: SignedDuration,
        skip: &[String],
    ) -> Result<Vec<ClaimedDelivery>, Error> {
        let skip = skip.to_vec();
        self.complete(move |e| async move { e.claim_deliveries(now, limit, claim_for, &skip).await }).await
    }

    async fn finish_delivery(
        &self,
        delivery_id: &str,
        attempt: u32,
        result: AttemptResult,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let delivery_id = delivery_id.to_owned();
        self.complete(move |e| async move { e.finish_delivery(&delivery_id, attempt, result, now).await }).await
    }

    async fn deliveries(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        let (endpoint_id, page) = (endpoint_id.to_owned(), page.clone());
        self.complete(move |e| async move { e.deliveries(&endpoint_id, &page).await }).await
    }

    async fn redeliver(&self, endpoint_id: &str, delivery_id: &str, now: Timestamp) -> Result<Delivery, Error> {
        let (endpoint_id, delivery_id) = (endpoint_id.to_owned(), delivery_id.to_owned());
        self.complete(move |e| async move { e.redeliver(&endpoint_id, &delivery_id, now).await }).await
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, Error> {
        self.complete(move |e| async move { e.outbox_counts().await }).await
    }
}
