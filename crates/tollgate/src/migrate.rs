//! `tollgate migrate`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::config::{self, DATABASE_URL_SETTING};

#[derive(Args)]
pub(crate) struct MigrateArgs {
    /// PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    database_url: Option<String>,
}

pub(crate) async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let url = args
        .database_url
        .with_context(|| format!("{DATABASE_URL_SETTING} is required: the memory store has no schema to migrate"))?;
    let options = config::database_options(&url)?;
    let pool = config::connect_pool(&options).await?;
    let where_ = config::describe_database(&options);
    let applied = tollgate_pg::migrations::apply(&pool).await.with_context(|| format!("migrating {where_} failed"))?;
    pool.close().await;
    if applied.is_empty() {
        println!(
            "nothing to do: {where_} is at version {:04}, the latest this binary knows",
            tollgate_pg::migrations::latest_version()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for migration in &applied {
        println!(
            "applied {:04} {} in {:.3} s",
            migration.version,
            migration.description,
            migration.duration.as_secs_f64()
        );
    }
    println!("{where_} is now at version {:04}", tollgate_pg::migrations::latest_version());
    Ok(ExitCode::SUCCESS)
}
