//! `tollgate serve`.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use jiff::SignedDuration;
use tollgate_core::{Error, GrantPolicy, RetryPolicy, Secret};
use tollgate_pg::{PgStoreConfig, PostgresStore};
use tollgate_server::{AppState, Limits, OperatorTokens, ReclaimConfig, SystemClock, WebhookSettings, clock_check};
use tollgate_store::{MemoryStore, Store, WebhookKey};

use crate::config::{self, DATABASE_URL_SETTING, parse_duration};

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: SocketAddr,

    /// Operator token with the admin role (at least 16 printable characters).
    /// Generated and printed when unset on the memory store.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    admin_token: Option<String>,

    /// Operator token with the gateway role.
    #[arg(long, env = "TOLLGATE_GATEWAY_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    gateway_token: Option<String>,

    /// Read-only operator token: signs in to the console at /console and sees
    /// every page, changes nothing; every /v1 route refuses it.
    #[arg(long, env = "TOLLGATE_VIEWER_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    viewer_token: Option<String>,

    /// Longest lease TTL; longer requests are clamped to it (ISO 8601).
    #[arg(long, env = "TOLLGATE_MAX_TTL", default_value = "PT1H", value_parser = parse_duration, value_name = "DURATION")]
    max_ttl: SignedDuration,

    /// Time after a lease's expiry before it may be reclaimed (ISO 8601). Every
    /// server on one database must use the same grace.
    #[arg(long, env = "TOLLGATE_RECLAIM_GRACE", default_value = "PT30S", value_parser = parse_duration, value_name = "DURATION")]
    reclaim_grace: SignedDuration,

    /// Time between reclaim passes (ISO 8601).
    #[arg(long, env = "TOLLGATE_RECLAIM_INTERVAL", default_value = "PT1S", value_parser = parse_duration, value_name = "DURATION")]
    reclaim_interval: SignedDuration,

    /// Most leases one reclaim pass settles.
    #[arg(long, env = "TOLLGATE_RECLAIM_BATCH", default_value_t = 1000, value_name = "LEASES")]
    reclaim_batch: u32,

    /// Longest time one request may take before it is answered 503 (ISO 8601).
    #[arg(long, env = "TOLLGATE_REQUEST_TIMEOUT", default_value = "PT30S", value_parser = parse_duration, value_name = "DURATION")]
    request_timeout: SignedDuration,

    /// Largest difference between this server's clock and the database's at
    /// which it serves (ISO 8601); default one second, or a quarter of the
    /// reclaim grace if that is shorter. Must be shorter than the grace.
    #[arg(long, env = "TOLLGATE_CLOCK_OFFSET_MAX", value_parser = parse_duration, value_name = "DURATION")]
    clock_offset_max: Option<SignedDuration>,

    /// How long the answer to a request sent with an Idempotency-Key answers
    /// its retries (ISO 8601); after it, the key is new again.
    #[arg(long, env = "TOLLGATE_IDEMPOTENCY_RETENTION", default_value = "PT24H", value_parser = parse_duration, value_name = "DURATION")]
    idempotency_retention: SignedDuration,
    /// Longest time a client may take to send one request head, from its first
    /// byte; a slower connection is closed (ISO 8601).
    #[arg(long, env = "TOLLGATE_HEADER_TIMEOUT", default_value = "PT10S", value_parser = parse_duration, value_name = "DURATION")]
    header_timeout: SignedDuration,

    /// Longest time a connection may wait for a request, when opened and
    /// between keep-alive requests, before it is closed (ISO 8601).
    #[arg(long, env = "TOLLGATE_IDLE_TIMEOUT", default_value = "PT60S", value_parser = parse_duration, value_name = "DURATION")]
    idle_timeout: SignedDuration,

    /// Most connections open at once; a connection beyond it is closed as soon
    /// as it is accepted. Lowered at startup to fit the open-file limit
    /// (`ulimit -n`) beside the database connections.
    #[arg(long, env = "TOLLGATE_MAX_CONNECTIONS", default_value_t = tollgate_server::CONNECTIONS_MAX_DEFAULT, value_name = "N")]
    max_connections: NonZeroU32,

    /// PostgreSQL URL; without it the server runs on the in-memory store.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    database_url: Option<String>,

    /// Most PostgreSQL connections this server opens.
    #[arg(long, env = "TOLLGATE_DATABASE_CONNECTIONS", default_value_t = 16, value_name = "N")]
    database_connections: u32,

    /// Key that seals webhook signing secrets at rest: 64 hex digits (e.g.
    /// `openssl rand -hex 32`). Every server on one database needs the same
    /// key. Without it, PostgreSQL servers refuse to create webhook endpoints
    /// and deliver nothing; the memory store draws a random one.
    #[arg(long, env = "TOLLGATE_WEBHOOK_KEY", hide_env_values = true, value_name = "HEX")]
    webhook_key: Option<String>,

    /// Whether webhook URLs may reach loopback, private and link-local
    /// addresses. Allowed by default, for local receivers; set false where
    /// admins must not reach internal services (SSRF).
    #[arg(long, env = "TOLLGATE_WEBHOOK_ALLOW_PRIVATE", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    webhook_allow_private: bool,

    /// Longest time one webhook delivery attempt may take (ISO 8601).
    #[arg(long, env = "TOLLGATE_WEBHOOK_TIMEOUT", default_value = "PT10S", value_parser = parse_duration, value_name = "DURATION")]
    webhook_timeout: SignedDuration,

    /// How long after its event a delivery is retried before it is marked
    /// failed (ISO 8601).
    #[arg(long, env = "TOLLGATE_WEBHOOK_GIVE_UP_AFTER", default_value = "PT24H", value_parser = parse_duration, value_name = "DURATION")]
    webhook_give_up_after: SignedDuration,

    /// Time between webhook worker ticks: deriving events and claiming due
    /// deliveries (ISO 8601).
    #[arg(long, env = "TOLLGATE_WEBHOOK_INTERVAL", default_value = "PT1S", value_parser = parse_duration, value_name = "DURATION")]
    webhook_interval: SignedDuration,

    /// Record this server's reclaim grace in the database even though another
    /// grace is recorded. Stop every other server first: servers sharing a
    /// database must share one grace.
    #[arg(long)]
    replace_recorded_grace: bool,
}

/// The store and what to tell the operator about it.
struct Opened {
    store: Arc<dyn Store>,
    description: String,
    /// The PostgreSQL store, to let its running operations finish at shutdown.
    postgres: Option<PostgresStore>,
}

pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::of(&args)?;
    let Configured { admin, gateway, generated } =
        configured_tokens(args.admin_token.clone(), args.gateway_token.clone(), args.database_url.is_none())?;
    let mut tokens = OperatorTokens::new(&admin, gateway.as_ref())
        .map_err(|error| anyhow::anyhow!("invalid operator token: {error}"))?;
    if let Some(viewer) = &args.viewer_token {
        tokens = tokens
            .with_viewer(&Secret::new(viewer.clone()))
            .map_err(|error| anyhow::anyhow!("invalid operator token: {error}"))?;
    }
    let opened = open_store(&args, &settings).await?;
    pin_reclaim_grace(opened.store.as_ref(), args.replace_recorded_grace).await?;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen / TOLLGATE_LISTEN)", args.listen))?;
    let address = listener.local_addr().context("the listening socket has no address")?;
    print_banner(&args, &settings, &opened.description, tokens.has_gateway(), &generated, &admin, address);

    let state = AppState::with_webhooks(
        opened.store,
        Arc::new(SystemClock),
        tokens,
        Limits {
            request_timeout: settings.request_timeout,
            idempotency_retention: args.idempotency_retention,
            header_timeout: settings.header_timeout,
            idle_timeout: settings.idle_timeout,
            connections_max: settings.connections_max,
            ..Limits::default()
        },
        settings.webhooks,
    );
    state.clock_guard().set_bound(settings.clock_offset_max);
    report_clock(&state).await?;
    tollgate_server::serve(listener, state, ReclaimConfig { interval: settings.interval }, shutdown_signal())
        .await
        .context("the HTTP server failed")?;
    if let Some(store) = opened.postgres {
        // Operations whose callers went away still run; let them finish.
        store.settled().await;
        store.pool().close().await;
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// The configuration `serve` derives from its arguments, each value checked.
struct Settings {
    policy: GrantPolicy,
    interval: std::time::Duration,
    request_timeout: std::time::Duration,
    header_timeout: std::time::Duration,
    idle_timeout: std::time::Duration,
    connections_max: NonZeroU32,
    /// The open-file limit that lowered `--max-connections`, if it did.
    lowered_by: Option<u64>,
    clock_offset_max: SignedDuration,
    webhooks: WebhookSettings,
}

impl Settings {
    fn of(args: &ServeArgs) -> anyhow::Result<Settings> {
        let policy = config::policy(args.max_ttl, args.reclaim_grace, args.reclaim_batch)?;
        let interval = config::positive_std("--reclaim-interval / TOLLGATE_RECLAIM_INTERVAL", args.reclaim_interval)?;
        let request_timeout =
            config::positive_std("--request-timeout / TOLLGATE_REQUEST_TIMEOUT", args.request_timeout)?;
        config::positive_std("--idempotency-retention / TOLLGATE_IDEMPOTENCY_RETENTION", args.idempotency_retention)?;
        let header_timeout = config::positive_std("--header-timeout / TOLLGATE_HEADER_TIMEOUT", args.header_timeout)?;
        let idle_timeout = config::positive_std("--idle-timeout / TOLLGATE_IDLE_TIMEOUT", args.idle_timeout)?;
        let database_connections = if args.database_url.is_some() { args.database_connections.max(1) } else { 0 };
        let (connections_max, lowered_by) =
            config::connections_cap(args.max_connections, database_connections, config::open_files_max())?;
        let clock_offset_max = match args.clock_offset_max {
            None => clock_check::OFFSET_MAX_DEFAULT.min(args.reclaim_grace / 4),
            Some(bound) if bound.is_negative() || bound >= args.reclaim_grace => bail!(
                "--clock-offset-max / TOLLGATE_CLOCK_OFFSET_MAX is {bound}; it must be at least zero and shorter \
                 than the reclaim grace ({}), or a server whose clock runs ahead could reclaim leases others \
                 still honour",
                args.reclaim_grace
            ),
            Some(bound) => bound,
        };
        let webhooks = webhook_settings(args)?;
        Ok(Settings {
            webhooks,
            policy,
            interval,
            request_timeout,
            header_timeout,
            idle_timeout,
            connections_max,
            lowered_by,
            clock_offset_max,
        })
    }
}

/// The webhook worker's settings; the memory store draws a random key when
/// none is given, since its secrets die with it.
fn webhook_settings(args: &ServeArgs) -> anyhow::Result<WebhookSettings> {
    let key = match &args.webhook_key {
        Some(hex) => Some(
            WebhookKey::from_hex(hex)
                .context("--webhook-key / TOLLGATE_WEBHOOK_KEY must be 64 hex digits (openssl rand -hex 32)")?,
        ),
        None if args.database_url.is_none() => Some(WebhookKey::random()),
        None => None,
    };
    let attempt_timeout = config::positive_std("--webhook-timeout / TOLLGATE_WEBHOOK_TIMEOUT", args.webhook_timeout)?;
    config::positive_std("--webhook-give-up-after / TOLLGATE_WEBHOOK_GIVE_UP_AFTER", args.webhook_give_up_after)?;
    let interval = config::positive_std("--webhook-interval / TOLLGATE_WEBHOOK_INTERVAL", args.webhook_interval)?;
    let retry = RetryPolicy { give_up_after: args.webhook_give_up_after, ..RetryPolicy::DEFAULT };
    Ok(WebhookSettings { key, allow_private: args.webhook_allow_private, attempt_timeout, retry, interval })
}

/// Opens the memory store, or PostgreSQL (applying pending migrations).
async fn open_store(args: &ServeArgs, settings: &Settings) -> anyhow::Result<Opened> {
    let Some(url) = &args.database_url else {
        return Ok(Opened {
            store: Arc::new(MemoryStore::new(settings.policy)),
            description: "memory (in this process; everything is lost when it stops)".to_owned(),
            postgres: None,
        });
    };
    let options = config::database_options(url)?;
    let where_ = config::describe_database(&options);
    // Waits inside an operation stay below the request timeout, so that
    // a write does not take effect long after its caller was answered.
    let wait_max = (settings.request_timeout / 2).min(PgStoreConfig::default().acquire_timeout);
    let pg_config = PgStoreConfig {
        connections_max: args.database_connections.max(1),
        acquire_timeout: wait_max,
        lock_timeout: Some(wait_max),
    };
    let store = PostgresStore::connect_with(url, settings.policy, pg_config)
        .await
        .map_err(|error| anyhow::anyhow!("cannot open PostgreSQL at {where_} ({DATABASE_URL_SETTING}): {error}"))?;
    let applied = store.applied_migrations();
    if !applied.is_empty() {
        let versions: Vec<String> = applied.iter().map(|m| format!("{:04}", m.version)).collect();
        tracing::info!(versions = %versions.join(","), "applied pending migrations at startup");
    }
    Ok(Opened { store: Arc::new(store.clone()), description: format!("postgres ({where_})"), postgres: Some(store) })
}

/// Every server sharing storage must settle grants under one boundary.
async fn pin_reclaim_grace(store: &dyn Store, replace: bool) -> anyhow::Result<()> {
    match store.pin_reclaim_grace(replace).await {
        Ok(()) => Ok(()),
        Err(Error::ReclaimGraceMismatch { recorded, configured }) => bail!(
            "reclaim grace mismatch: the database records {recorded}, but --reclaim-grace / TOLLGATE_RECLAIM_GRACE \
             is {configured}. Servers sharing a database must share one grace; start this one with the recorded \
             grace, or stop every server and start one with --replace-recorded-grace to record a new grace"
        ),
        Err(error) => bail!("cannot record the reclaim grace in storage: {error}"),
    }
}

/// What the operator reads at startup, ending with the listening line.
fn print_banner(
    args: &ServeArgs,
    settings: &Settings,
    store: &str,
    has_gateway: bool,
    generated: &[(&'static str, Secret)],
    admin: &Secret,
    address: SocketAddr,
) {
    println!("tollgate {}", env!("CARGO_PKG_VERSION"));
    println!("store: {store}");
    println!(
        "policy: max ttl {}, reclaim grace {}, reclaim every {} in batches of at most {}",
        args.max_ttl, args.reclaim_grace, args.reclaim_interval, args.reclaim_batch
    );
    let connections_max = settings.connections_max;
    match settings.lowered_by {
        None => println!(
            "connections: at most {connections_max} open; header timeout {}, idle timeout {}",
            args.header_timeout, args.idle_timeout
        ),
        Some(files_max) => println!(
            "connections: at most {connections_max} open, lowered from {} (--max-connections / \
             TOLLGATE_MAX_CONNECTIONS) to fit the open-file limit {files_max}; header timeout {}, idle timeout {}",
            args.max_connections, args.header_timeout, args.idle_timeout
        ),
    }
    if generated.is_empty() {
        println!(
            "auth: send Authorization: Bearer <token> with the admin token{} you configured",
            if has_gateway { " or the gateway token" } else { "" }
        );
    } else {
        println!("auth: generated operator tokens for this run (set them yourself to keep them across restarts):");
        for (env, secret) in generated {
            println!("  {env}={}", secret.expose());
        }
        println!("  e.g. curl -H 'Authorization: Bearer {}' http://{address}/v1/admin/check", admin.expose());
    }
    println!(
        "console: http://{address}/console (sign in with the admin token{})",
        if args.viewer_token.is_some() { ", or the viewer token to look only" } else { "" }
    );
    println!("listening on http://{address}");
}

/// Compares this server's clock with the database's once at startup: a
/// skewed server starts but does not serve until the clocks agree.
async fn report_clock(state: &AppState) -> anyhow::Result<()> {
    match clock_check::check(state).await {
        Ok(None) => {}
        Ok(Some(status)) if status.skewed() => {
            tracing::error!("not serving until the clocks agree: {}", status.explain())
        }
        Ok(Some(status)) => println!(
            "clock: {} from the database's (± {}), within the bound of {}",
            status.sample.offset, status.sample.uncertainty, status.bound
        ),
        Err(error) => bail!("cannot read the database's clock: {error}"),
    }
    Ok(())
}

/// The operator tokens, and which of them were generated for this run.
struct Configured {
    admin: Secret,
    gateway: Option<Secret>,
    generated: Vec<(&'static str, Secret)>,
}

/// A memory store is private to this process, so random tokens printed once
/// make the first run work with no setup. Shared storage needs tokens the
/// operator chose: at least the admin token.
fn configured_tokens(admin: Option<String>, gateway: Option<String>, on_memory: bool) -> anyhow::Result<Configured> {
    let mut generated = Vec::new();
    let mut generate = |env: &'static str, prefix: &str| {
        let secret = Secret::new(format!("{prefix}{}", hex::encode(rand::random::<[u8; 24]>())));
        generated.push((env, secret.clone()));
        secret
    };
    let admin = match admin {
        Some(token) => Secret::new(token),
        None if on_memory => generate("TOLLGATE_ADMIN_TOKEN", "tga_"),
        None => bail!(
            "--admin-token / TOLLGATE_ADMIN_TOKEN is required with a database: \
             tokens are generated only for the memory store"
        ),
    };
    let gateway = match gateway {
        Some(token) => Some(Secret::new(token)),
        None if on_memory => Some(generate("TOLLGATE_GATEWAY_TOKEN", "tgw_")),
        None => None,
    };
    Ok(Configured { admin, gateway, generated })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    tracing::info!("shutting down: no new connections, finishing requests in flight");
}
