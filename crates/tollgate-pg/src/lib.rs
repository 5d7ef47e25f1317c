//! Tollgate's PostgreSQL side: the embedded migrations, `PostgresStore`, and
//! (behind the `testing` feature) a per-test database harness.
//!
//! Invariants this crate keeps: every SQL statement is parameterised and names
//! its columns; each store operation writes in one transaction; rows are locked in one
//! global order (a keyed request's idempotency key, then accounts, then leases,
//! then credentials); the rules themselves
//! live in `tollgate-core`, never here.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::too_many_lines))]

pub mod inspect;
pub mod migrations;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use migrations::{AppliedMigration, MIGRATOR, MigrationError};
pub use store::{ConnectError, PgStoreConfig, PostgresStore};
