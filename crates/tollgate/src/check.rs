//! `tollgate check`: what an operator runs before resuming traffic after an
//! upgrade. It only reads. It works on a database that is not migrated yet,
//! so that it can say so; the ledger is checked only on a current schema.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use jiff::SignedDuration;
use sqlx::PgPool;
use tollgate_api::{CheckBody, GuardViolationBody, LedgerCheckBody, StorageBody};
use tollgate_core::GrantPolicy;
use tollgate_pg::PostgresStore;
use tollgate_store::{MigrationStatus, Store};

use crate::config::{self, DATABASE_URL_SETTING};

#[derive(Args)]
pub(crate) struct CheckArgs {
    /// PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    database_url: Option<String>,

    /// Print the report as JSON (the body of `GET /v1/admin/check`).
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let url = args.database_url.with_context(|| {
        format!(
            "{DATABASE_URL_SETTING} is required: the memory store lives inside its server; \
             ask a running server with GET /v1/admin/check instead"
        )
    })?;
    let options = config::database_options(&url)?;
    let body = match config::connect_pool(&options).await {
        Ok(pool) => {
            let body = check_database(&pool).await;
            pool.close().await;
            body
        }
        Err(error) => CheckBody::new(unreachable(format!("{error:#}")), None, None),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&body).context("the report serialises")?);
    } else {
        print!("{}", human(&body, &config::describe_database(&options)));
    }
    Ok(if body.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn check_database(pool: &PgPool) -> CheckBody {
    let migrations = match migration_status(pool).await {
        Ok(status) => status,
        Err(error) => return CheckBody::new(unreachable(error.to_string()), None, None),
    };
    let mut storage = StorageBody {
        backend: "postgres".to_owned(),
        reachable: true,
        error: None,
        migrations: Some((&migrations).into()),
    };
    if migrations.is_current() {
        // The schema is exactly the embedded catalogue, so opening the store
        // applies nothing. The policy only matters for writes, which a check
        // never makes.
        let store = match PostgresStore::from_pool(
            pool.clone(),
            GrantPolicy::new(SignedDuration::from_secs(1), SignedDuration::ZERO, 1).expect("a valid policy"),
        )
        .await
        {
            Ok(store) => store,
            Err(error) => {
                storage.error = Some(error.to_string());
                return CheckBody::new(storage, None, None);
            }
        };
        return match store.check().await {
            Ok(report) => CheckBody::from_report(storage, &report),
            Err(error) => {
                storage.error = Some(error.to_string());
                CheckBody::new(storage, None, None)
            }
        };
    }
    // Not current: conservation and the legacy bounds need the current
    // schema, but the guard inspection reads only columns every schema since
    // 0008 has, so it still runs on a database that has any tables.
    storage.error = Some("the schema is not current, so conservation and legacy bounds were not checked".to_owned());
    if migrations.applied.is_empty() {
        return CheckBody::new(storage, None, None);
    }
    let guards = match tollgate_pg::inspect::inspect_guards(pool).await {
        Ok(guards) => Some(guards.iter().map(GuardViolationBody::from).collect()),
        Err(error) => {
            storage.error = Some(format!("the schema is not current, and the guard inspection failed: {error}"));
            None
        }
    };
    CheckBody::new(storage, None, guards)
}

fn unreachable(error: String) -> StorageBody {
    StorageBody { backend: "postgres".to_owned(), reachable: false, error: Some(error), migrations: None }
}

/// Applied versions as sqlx records them; none when the bookkeeping table does
/// not exist yet (a database never migrated).
async fn migration_status(pool: &PgPool) -> Result<MigrationStatus, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(pool).await?;
    let applied: Vec<i64> = if exists {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(pool)
            .await?
    } else {
        Vec::new()
    };
    let known = tollgate_pg::MIGRATOR.iter().map(|m| m.version).collect();
    Ok(MigrationStatus { applied, known })
}

fn versions(list: &[i64]) -> String {
    if list.is_empty() {
        return "none".to_owned();
    }
    list.iter().map(|v| format!("{v:04}")).collect::<Vec<_>>().join(", ")
}

/// The report for people.
pub(crate) fn human(body: &CheckBody, where_: &str) -> String {
    let mut out = String::new();
    human_storage(&mut out, &body.storage, where_);
    match &body.ledger {
        None => out.push_str("conservation: not checked\n"),
        Some(ledger) => human_ledger(&mut out, ledger),
    }
    match &body.guard_violations {
        None => out.push_str("guards:      not inspected\n"),
        Some(guards) => {
            out.push_str(&format!("guards:      {} stored rows break a database guard\n", guards.len()));
            for g in guards {
                out.push_str(&format!("  VIOLATION {} {}: {} = {}\n", g.table, g.key, g.column, g.value));
            }
        }
    }
    out.push_str(if body.ok { "result:      OK\n" } else { "result:      NOT OK\n" });
    out
}

fn human_storage(out: &mut String, storage: &StorageBody, where_: &str) {
    if storage.reachable {
        out.push_str(&format!("storage:     reachable ({} at {where_})\n", storage.backend));
    } else {
        out.push_str(&format!(
            "storage:     UNREACHABLE ({where_}): {}\n",
            storage.error.as_deref().unwrap_or("unknown error")
        ));
    }
    if let Some(m) = &storage.migrations {
        out.push_str(&format!(
            "migrations:  {} ({} of {} known versions applied)\n",
            if m.current { "current" } else { "NOT CURRENT" },
            m.applied.iter().filter(|v| m.known.contains(v)).count(),
            m.known.len()
        ));
        if !m.pending.is_empty() {
            out.push_str(&format!("  pending:   {} (run `tollgate migrate`)\n", versions(&m.pending)));
        }
        if !m.unknown.is_empty() {
            out.push_str(&format!("  unknown:   {} (a newer binary migrated this database)\n", versions(&m.unknown)));
        }
    }
    if storage.reachable
        && let Some(error) = &storage.error
    {
        out.push_str(&format!("note:        {error}\n"));
    }
}

fn human_ledger(out: &mut String, ledger: &LedgerCheckBody) {
    out.push_str(&format!(
        "conservation: {} accounts checked, {} violations\n",
        ledger.accounts_checked,
        ledger.violations.len()
    ));
    for v in &ledger.violations {
        out.push_str(&format!("  VIOLATION account {}: {} ({} != {})\n", v.account_id, v.equation, v.left, v.right));
    }
    out.push_str(&format!(
        "journals:    {} accounts do not replay to their counters\n",
        ledger.journal_mismatches.len()
    ));
    for m in &ledger.journal_mismatches {
        out.push_str(&format!("  MISMATCH account {}: {}\n", m.account_id, m.reason));
    }
    out.push_str(&format!("usage totals: {} hours differ from their events\n", ledger.usage_totals_mismatches.len()));
    for m in &ledger.usage_totals_mismatches {
        out.push_str(&format!(
            "  MISMATCH account {} hour {} credential {} {} {}: kept {} units in {} events, counted {} in {}\n",
            m.account_id,
            m.hour,
            m.credential_id,
            m.funding,
            m.dimensions,
            m.kept_units,
            m.kept_events,
            m.counted_units,
            m.counted_events
        ));
    }
    out.push_str("legacy bounds (state, expiry_is_upper_bound, count):\n");
    if ledger.legacy_bounds.is_empty() {
        out.push_str("  no leases\n");
    }
    for b in &ledger.legacy_bounds {
        out.push_str(&format!("  {:<13} {:<5} {}\n", b.state, b.expiry_is_upper_bound, b.count));
    }
}
