//! The PostgreSQL store's tests, as one test binary. Each test creates its
//! own database (`TestDb`): the conformance suite on a plain and on a
//! hash-partitioned schema, cancellation at every await, keyed requests,
//! PostgreSQL-only store behaviour (`store`, and the outbox's across servers
//! in `outbox`), the schema's own guards, the proof that the schema shards
//! by account, the usage index, the lease summary's index, and every upgrade
//! on populated databases (`fixtures`: the 0016-era writer and the probes the
//! upgrade suites share).

mod cancellation;
mod conformance;
mod fixtures;
mod idempotency;
mod lease_summary_index;
mod migrations;
mod outbox;
mod partitioning;
mod plans;
mod reclaim;
mod schema;
mod store;
mod upgrade_0015_0016;
mod upgrade_0017;
mod upgrade_0017_legacy_grants;
mod upgrade_0020;
mod upgrade_0022;
mod upgrade_0025;
mod usage_index;
