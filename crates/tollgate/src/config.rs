//! Settings shared by the subcommands, and their validation. Every error names
//! the flag and the environment variable it came from.

use std::num::NonZeroU32;
use std::time::Duration;

use anyhow::{Context, bail};
use jiff::SignedDuration;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use tollgate_core::{GrantPolicy, PolicyError};

/// Parses an ISO 8601 duration such as `PT30S` or `PT0.000000001S`.
pub(crate) fn parse_duration(value: &str) -> Result<SignedDuration, String> {
    let trimmed = value.trim();
    if !(trimmed.starts_with('P') || trimmed.starts_with('p') || trimmed.starts_with("-P") || trimmed.starts_with("-p"))
    {
        return Err(format!("expected an ISO 8601 duration such as PT30S or PT0.5S, got {value:?}"));
    }
    trimmed.parse::<SignedDuration>().map_err(|e| format!("expected an ISO 8601 duration such as PT30S: {e}"))
}

/// A positive duration as a `std` one, for timers.
pub(crate) fn positive_std(setting: &str, value: SignedDuration) -> anyhow::Result<Duration> {
    if !value.is_positive() {
        bail!("{setting} must be positive, got {value}");
    }
    Duration::try_from(value).with_context(|| format!("{setting} is out of range: {value}"))
}

/// The grant policy, with errors that name the setting at fault.
pub(crate) fn policy(
    max_ttl: SignedDuration,
    reclaim_grace: SignedDuration,
    reclaim_batch: u32,
) -> anyhow::Result<GrantPolicy> {
    GrantPolicy::new(max_ttl, reclaim_grace, reclaim_batch).map_err(|error| {
        let setting = match error {
            PolicyError::MaxTtlNotPositive(_) => "--max-ttl / TOLLGATE_MAX_TTL",
            PolicyError::ReclaimGraceNegative(_) => "--reclaim-grace / TOLLGATE_RECLAIM_GRACE",
            PolicyError::ReclaimBatchMaxOutOfRange { .. } => "--reclaim-batch / TOLLGATE_RECLAIM_BATCH",
        };
        anyhow::anyhow!("invalid {setting}: {error}")
    })
}

/// Descriptors the process holds besides client and database connections: the
/// listener, standard streams, the runtime's and the resolver's own.
pub(crate) const FILES_RESERVED: u64 = 32;

/// The process's soft limit on open files, or `None` when it has none.
pub(crate) fn open_files_max() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// The open-connection cap, lowered to fit the open-file limit when it does
/// not: a server that runs out of descriptors cannot accept even the request
/// that would let a client see it is full, so the cap must bind first. Returns
/// the cap to use and, when it was lowered, the limit that lowered it.
pub(crate) fn connections_cap(
    configured: NonZeroU32,
    database_connections: u32,
    open_files_max: Option<u64>,
) -> anyhow::Result<(NonZeroU32, Option<u64>)> {
    let Some(files_max) = open_files_max else { return Ok((configured, None)) };
    let room = files_max.saturating_sub(FILES_RESERVED + u64::from(database_connections));
    if u64::from(configured.get()) <= room {
        return Ok((configured, None));
    }
    let fitted = u32::try_from(room).ok().and_then(NonZeroU32::new).ok_or_else(|| {
        anyhow::anyhow!(
            "the open-file limit ({files_max}, ulimit -n) leaves no room for a client connection beside \
             {FILES_RESERVED} reserved descriptors and {database_connections} database connections \
             (--database-connections / TOLLGATE_DATABASE_CONNECTIONS); raise the limit"
        )
    })?;
    Ok((fitted, Some(files_max)))
}

/// The setting name of the database URL, for messages.
pub(crate) const DATABASE_URL_SETTING: &str = "--database-url / DATABASE_URL";

/// Parses the database URL without echoing it: it may hold a password.
pub(crate) fn database_options(url: &str) -> anyhow::Result<PgConnectOptions> {
    url.parse::<PgConnectOptions>().map_err(|error| {
        anyhow::anyhow!("invalid {DATABASE_URL_SETTING}: {}", redact_url_error(&error.to_string(), url))
    })
}

/// `host:port/database`, which identifies a database without its credentials.
pub(crate) fn describe_database(options: &PgConnectOptions) -> String {
    format!("{}:{}/{}", options.get_host(), options.get_port(), options.get_database().unwrap_or("(default)"))
}

/// A small pool that does not migrate, for `migrate` and `check`.
pub(crate) async fn connect_pool(options: &PgConnectOptions) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.clone().disable_statement_logging())
        .await
        .with_context(|| format!("cannot reach PostgreSQL at {} ({DATABASE_URL_SETTING})", describe_database(options)))
}

fn redact_url_error(message: &str, url: &str) -> String {
    if url.is_empty() { message.to_owned() } else { message.replace(url, "<database url>") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_iso_8601_with_nanoseconds() {
        assert_eq!(parse_duration("PT30S"), Ok(SignedDuration::from_secs(30)));
        assert_eq!(parse_duration("PT0.000000001S"), Ok(SignedDuration::from_nanos(1)));
        assert_eq!(parse_duration("-PT1S"), Ok(SignedDuration::from_secs(-1)));
        assert!(parse_duration("30s").is_err());
        assert!(parse_duration("PT").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn policy_errors_name_the_setting() {
        let s = SignedDuration::from_secs;
        let message = |result: anyhow::Result<GrantPolicy>| result.unwrap_err().to_string();
        assert!(message(policy(s(0), s(0), 1)).contains("TOLLGATE_MAX_TTL"));
        assert!(message(policy(s(1), s(-1), 1)).contains("TOLLGATE_RECLAIM_GRACE"));
        assert!(message(policy(s(1), s(0), 0)).contains("TOLLGATE_RECLAIM_BATCH"));
        assert!(policy(s(1), s(0), 1).is_ok());
        assert!(positive_std("--reclaim-interval", s(0)).unwrap_err().to_string().contains("--reclaim-interval"));
        assert_eq!(positive_std("x", SignedDuration::from_millis(5)).unwrap(), Duration::from_millis(5));
    }

    #[test]
    fn the_connection_cap_fits_the_open_file_limit() {
        let n = |value: u32| NonZeroU32::new(value).unwrap();
        assert_eq!(connections_cap(n(512), 16, None).unwrap(), (n(512), None));
        assert_eq!(connections_cap(n(512), 16, Some(1024)).unwrap(), (n(512), None));
        assert_eq!(connections_cap(n(512), 16, Some(512 + 16 + FILES_RESERVED)).unwrap(), (n(512), None));
        assert_eq!(connections_cap(n(512), 0, Some(256)).unwrap(), (n(256 - 32), Some(256)));
        assert_eq!(connections_cap(n(512), 16, Some(256)).unwrap(), (n(256 - 32 - 16), Some(256)));
        assert_eq!(connections_cap(n(512), 16, Some(u64::MAX)).unwrap(), (n(512), None));
        let error = connections_cap(n(512), 16, Some(48)).unwrap_err().to_string();
        assert!(error.contains("TOLLGATE_DATABASE_CONNECTIONS") && error.contains("48"), "{error}");
    }
}
