//! What a derivation or a refusal stores, in one statement
//! (`STORE_DERIVED_SQL`), and the endpoints its events fan out to.

use sqlx::PgConnection;
use tollgate_core::{AlertRule, COUNTER_NAMES, COUNTERS, Error, Event, InstantPair};
use tollgate_store::{event_body, new_delivery_id};

use super::rows::{Wanting, WantingRow};
use crate::store::errors::{db_i64, storage_error};
use crate::store::sql::{SHARE_ENDPOINTS_SQL, STORE_DERIVED_SQL};

/// Where an account's cursor moves: to entry `seq`, after which its
/// counters are `counters`. Converted to `BIGINT`s when made, so that a value
/// out of range fails before anything of its account is added to `Outgoing`,
/// whose parallel columns must stay the same length.
pub(super) struct CursorWrite {
    account_id: String,
    seq: i64,
    /// In `COUNTER_NAMES` order.
    counters: [i64; COUNTERS],
}

impl CursorWrite {
    pub(super) fn new(account_id: &str, seq: u64, counters: &[u64; COUNTERS]) -> Result<Self, Error> {
        let seq = db_i64(seq, "journal_seq")?;
        let mut values = [0; COUNTERS];
        for ((slot, value), name) in values.iter_mut().zip(counters).zip(COUNTER_NAMES) {
            *slot = db_i64(*value, name)?;
        }
        Ok(Self { account_id: account_id.to_owned(), seq, counters: values })
    }
}

/// A rule's new `refused_at_seq`, converted when made, like `CursorWrite`.
pub(super) struct RuleWrite {
    account_id: String,
    rule_id: String,
    refused_at_seq: Option<i64>,
}

impl RuleWrite {
    pub(super) fn new(rule: &AlertRule) -> Result<Self, Error> {
        Ok(Self {
            account_id: rule.account_id.clone(),
            rule_id: rule.rule_id.clone(),
            refused_at_seq: rule.refused_at_seq.map(|seq| db_i64(seq, "refused_at_seq")).transpose()?,
        })
    }
}

/// What a derivation or a refusal stores: the parallel arrays
/// `STORE_DERIVED_SQL` binds, one per column.
#[derive(Default)]
pub(super) struct Outgoing {
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
    pub(super) fn fan_out(&mut self, event: &Event, endpoints: &[Wanting]) {
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

    /// Moves an account's cursor.
    pub(super) fn cursor(&mut self, cursor: CursorWrite) {
        let cursors = &mut self.cursors;
        cursors.account_ids.push(cursor.account_id);
        cursors.seqs.push(cursor.seq);
        for (column, value) in cursors.counters.iter_mut().zip(cursor.counters) {
            column.push(value);
        }
    }

    /// Removes a deleted rule that judges no entry left to derive.
    pub(super) fn purge(&mut self, rule: &AlertRule) {
        self.rules.purged_account_ids.push(rule.account_id.clone());
        self.rules.purged_rule_ids.push(rule.rule_id.clone());
    }

    /// Writes a rule's `refused_at_seq`.
    pub(super) fn rule(&mut self, rule: RuleWrite) {
        self.rules.account_ids.push(rule.account_id);
        self.rules.rule_ids.push(rule.rule_id);
        self.rules.refused_at_seqs.push(rule.refused_at_seq);
    }

    pub(super) async fn store(self, conn: &mut PgConnection) -> Result<(), Error> {
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
pub(super) async fn share_endpoints(conn: &mut PgConnection) -> Result<Vec<Wanting>, Error> {
    let rows: Vec<WantingRow> =
        sqlx::query_as(SHARE_ENDPOINTS_SQL).fetch_all(&mut *conn).await.map_err(storage_error)?;
    rows.into_iter().map(WantingRow::decode).collect()
}
