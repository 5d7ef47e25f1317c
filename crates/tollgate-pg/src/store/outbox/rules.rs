//! Alert rules: creating, listing and deleting them, and firing the armed
//! `acquire_refused` rules at a refusal, which has no journal entry.

use jiff::Timestamp;
use sqlx::{FromRow, PgConnection};
use tollgate_core::alerts::{RULES_PER_ACCOUNT_MAX, refusal_events};
use tollgate_core::{AlertRule, Error, InstantPair};
use tollgate_store::{NewAlertRule, new_rule_id};

use super::outgoing::{Outgoing, RuleWrite, share_endpoints};
use super::rows::{RuleRow, bound, nonnegative};
use crate::store::errors::{db_i64, storable, storage_error};
use crate::store::rows::AccountRow;
use crate::store::sql::{
    INSERT_RULE_SQL, LOCK_ACCOUNT_SEQ_SQL, LOCK_REFUSAL_RULES_SQL, PURGE_RETIRED_RULES_SQL, READ_RULES_SQL,
    REFUSAL_ACCOUNT_SQL, RETIRE_RULE_SQL,
};
use crate::store::{DOMAIN, Engine};

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
    let events = refusal_events(&mut rules, account_id, seq, &counters, now, &new_rule_id());
    if events.is_empty() {
        return Ok(0);
    }
    let endpoints = share_endpoints(conn).await?;
    let mut outgoing = Outgoing::default();
    for event in &events {
        outgoing.fan_out(event, &endpoints);
    }
    // The rules that fired, which `refusal_events` disarmed.
    for rule in rules.iter().filter(|rule| events.iter().any(|e| e.rule_id.as_ref() == Some(&rule.rule_id))) {
        outgoing.rule(RuleWrite::new(rule)?);
    }
    outgoing.store(conn).await?;
    Ok(u32::try_from(events.len()).unwrap_or(u32::MAX))
}

impl Engine {
    pub(super) async fn create_rule(&self, rule: NewAlertRule<'_>, now: Timestamp) -> Result<AlertRule, Error> {
        let NewAlertRule { account_id, condition } = rule;
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        // A threshold in units beyond the unit domain is refused as units
        // are; a percent is always within it.
        let threshold = condition.threshold().map(|units| DOMAIN.check(units)).transpose()?;
        let threshold = threshold.map(|units| db_i64(units, "threshold")).transpose()?;
        let (rule_id, created) = (new_rule_id(), InstantPair::encode(now));
        self.transaction(async |tx: &mut PgConnection| {
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
        })
        .await
    }

    pub(super) async fn rules_of(&self, account_id: &str) -> Result<Vec<AlertRule>, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let rows: Vec<RuleRow> =
            sqlx::query_as(READ_RULES_SQL).bind(account_id).fetch_all(&self.pool).await.map_err(storage_error)?;
        self.existing(account_id, rows.len()).await?;
        rows.into_iter().map(RuleRow::decode).collect()
    }

    pub(super) async fn delete_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error> {
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
        self.transaction(async |tx: &mut PgConnection| {
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
        })
        .await
    }

    pub(super) async fn refuse(&self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        self.transaction(async |conn: &mut PgConnection| refuse_in(conn, account_id, now).await).await
    }
}
