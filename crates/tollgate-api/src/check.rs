//! The bodies of `GET /v1/admin/check` and of the storage part of
//! `/readyz`: the ledger's equations, legacy bounds, guard violations,
//! journals that do not replay, usage totals that differ from their events,
//! and the migration status.

use serde::{Deserialize, Serialize};
use tollgate_core::Violation;
use tollgate_store::{
    CheckReport, GuardViolation, LegacyBoundCount, MigrationStatus, StorageStatus, UsageTotalsMismatch,
};
use utoipa::ToSchema;

use crate::JournalMismatchBody;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ViolationBody {
    pub account_id: String,
    pub equation: String,
    /// Both sides as decimal strings: a corrupt store may exceed `u64`.
    pub left: String,
    pub right: String,
}

impl From<&Violation> for ViolationBody {
    fn from(v: &Violation) -> Self {
        Self {
            account_id: v.account_id.clone(),
            equation: v.equation.code().to_owned(),
            left: v.left.to_string(),
            right: v.right.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LegacyBoundBody {
    pub state: String,
    pub expiry_is_upper_bound: bool,
    pub count: u64,
}

impl From<&LegacyBoundCount> for LegacyBoundBody {
    fn from(c: &LegacyBoundCount) -> Self {
        Self { state: c.state.as_str().to_owned(), expiry_is_upper_bound: c.expiry_is_upper_bound, count: c.count }
    }
}

/// A stored row that a database guard forbids, found by the read-only
/// guard inspection queries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GuardViolationBody {
    pub table: String,
    pub key: String,
    pub column: String,
    pub value: i64,
}

impl From<&GuardViolation> for GuardViolationBody {
    fn from(g: &GuardViolation) -> Self {
        Self { table: g.table.clone(), key: g.key.clone(), column: g.column.clone(), value: g.value }
    }
}

/// Conservation and legacy-bound part of `GET /v1/admin/check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LedgerCheckBody {
    pub accounts_checked: u64,
    /// Every violated equation of every account; empty when all hold.
    pub violations: Vec<ViolationBody>,
    /// `(state, expiry_is_upper_bound, count)` over every stored lease.
    pub legacy_bounds: Vec<LegacyBoundBody>,
    /// Accounts whose journal does not replay to their counters; empty when
    /// every journal does.
    #[serde(default)]
    pub journal_mismatches: Vec<JournalMismatchBody>,
    /// Hourly usage totals that differ from the accepted events they total;
    /// empty when all agree, and always on the memory store, which keeps none.
    #[serde(default)]
    pub usage_totals_mismatches: Vec<UsageTotalsMismatchBody>,
}

/// One hour of an account's usage totals (one credential, funding and set of
/// dimensions) that differs from its events (`check`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageTotalsMismatchBody {
    pub account_id: String,
    /// The hour's start, RFC 3339.
    pub hour: String,
    pub credential_id: String,
    /// `leased` or `overage`.
    pub funding: String,
    /// The dimensions as JSON text.
    pub dimensions: String,
    /// Units and events as the totals keep them and as the events count
    /// them, as decimal strings.
    pub kept_units: String,
    pub kept_events: String,
    pub counted_units: String,
    pub counted_events: String,
}

impl From<&UsageTotalsMismatch> for UsageTotalsMismatchBody {
    fn from(m: &UsageTotalsMismatch) -> Self {
        let hour = jiff::Timestamp::from_second(m.hour.saturating_mul(3600))
            .map_or_else(|_| format!("hour {}", m.hour), |at| at.to_string());
        Self {
            account_id: m.account_id.clone(),
            hour,
            credential_id: m.credential_id.clone(),
            funding: m.funding.to_owned(),
            dimensions: m.dimensions.clone(),
            kept_units: m.kept.0.to_string(),
            kept_events: m.kept.1.to_string(),
            counted_units: m.counted.0.to_string(),
            counted_events: m.counted.1.to_string(),
        }
    }
}

impl From<&CheckReport> for LedgerCheckBody {
    fn from(r: &CheckReport) -> Self {
        Self {
            accounts_checked: r.accounts_checked,
            violations: r.violations.iter().map(ViolationBody::from).collect(),
            legacy_bounds: r.legacy_bounds.iter().map(LegacyBoundBody::from).collect(),
            journal_mismatches: r.journal_mismatches.iter().map(JournalMismatchBody::from).collect(),
            usage_totals_mismatches: r.usage_totals_mismatches.iter().map(UsageTotalsMismatchBody::from).collect(),
        }
    }
}

/// Migration versions: what the database records and what this binary carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MigrationsBody {
    pub applied: Vec<i64>,
    pub known: Vec<i64>,
    /// Known but not applied yet: run `tollgate migrate`.
    pub pending: Vec<i64>,
    /// Applied but unknown to this binary: a newer binary migrated the database.
    pub unknown: Vec<i64>,
    pub current: bool,
}

impl From<&MigrationStatus> for MigrationsBody {
    fn from(m: &MigrationStatus) -> Self {
        Self {
            applied: m.applied.clone(),
            known: m.known.clone(),
            pending: m.pending(),
            unknown: m.unknown(),
            current: m.is_current(),
        }
    }
}

/// Whether storage answers, and its schema state where it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StorageBody {
    /// `memory` or `postgres`.
    pub backend: String,
    pub reachable: bool,
    /// Why storage could not be reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Absent for stores without a schema.
    #[serde(default)]
    pub migrations: Option<MigrationsBody>,
}

impl StorageBody {
    pub fn from_status(status: &StorageStatus) -> Self {
        Self {
            backend: status.backend.to_owned(),
            reachable: true,
            error: None,
            migrations: status.migrations.as_ref().map(MigrationsBody::from),
        }
    }

    /// Reachable, and the schema (if any) is exactly the one this binary knows.
    pub fn is_ready(&self) -> bool {
        self.reachable && self.migrations.as_ref().is_none_or(|m| m.current)
    }
}

/// `GET /v1/admin/check` and `tollgate check --json`: what an operator checks
/// before resuming traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckBody {
    /// True when storage is ready, every equation holds and no stored row
    /// breaks a database guard.
    pub ok: bool,
    pub storage: StorageBody,
    /// Absent when the ledger could not be checked (storage unreachable or
    /// its schema not current).
    #[serde(default)]
    pub ledger: Option<LedgerCheckBody>,
    /// Stored rows that a database guard forbids (the guard inspection).
    /// Absent when they could not be inspected; always empty on the memory
    /// store, whose types cannot hold such rows.
    #[serde(default)]
    pub guard_violations: Option<Vec<GuardViolationBody>>,
}

impl CheckBody {
    pub fn new(
        storage: StorageBody,
        ledger: Option<LedgerCheckBody>,
        guard_violations: Option<Vec<GuardViolationBody>>,
    ) -> Self {
        let ok = storage.is_ready()
            && ledger.as_ref().is_some_and(|l| {
                l.violations.is_empty() && l.journal_mismatches.is_empty() && l.usage_totals_mismatches.is_empty()
            })
            && guard_violations.as_ref().is_some_and(Vec::is_empty);
        Self { ok, storage, ledger, guard_violations }
    }

    /// The report of a store's `check` on ready storage.
    pub fn from_report(storage: StorageBody, report: &CheckReport) -> Self {
        let guards = report.guard_violations.iter().map(GuardViolationBody::from).collect();
        Self::new(storage, Some(LedgerCheckBody::from(report)), Some(guards))
    }
}
