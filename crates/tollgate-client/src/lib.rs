//! Tollgate's client library, embedded by gateway workers.
//!
//! - [`UsageWriter`]: a bounded, batching, retrying writer of usage events over
//!   any [`UsageSink`](tollgate_store::UsageSink), with exact accounting of every
//!   event it takes: accepted, duplicate, rejected or lost, never silently gone.
//! - [`TollgateClient`]: the typed HTTP client for every `/v1` route. The
//!   writer runs over it ([`UsageWriter::over_http`]) or over a store directly.
//! - [`Gateway`]: one lease per account, spent locally, renewed before expiry
//!   and released at shutdown after its usage is delivered.
//! - [`webhooks::verify`]: checks the signature of a webhook Tollgate sent.
//!
//! The writer decides whether usage survives failures, so its rules are few and
//! strict: retry what can succeed, never retry what cannot, bound everything,
//! and report every event it could not deliver.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::too_many_lines))]

mod config;
mod gateway;
mod http;
mod stats;
pub mod webhooks;
mod writer;

pub use config::{
    ATTEMPTS_LIMIT, BACKOFF_INITIAL_LIMIT, BACKOFF_LIMIT, BACKOFF_MIN, BATCH_AGE_LIMIT, BATCH_AGE_MIN, BatchGrouping,
    ConfigError, QUEUE_EVENTS_LIMIT, RetryConfig, WriterConfig,
};
pub use gateway::{
    Gateway, GatewayConfig, GatewayConfigError, GatewayReport, RenewReport, Spend, SpendError, SpendReceipt,
};
pub use http::{
    ClientBuildError, ClientConfig, ClientError, ClientErrorKind, Credited, MUTATION_ATTEMPTS_MAX,
    MUTATION_BACKOFF_INITIAL_MAX, NdjsonEvents, PageQuery, Pages, RESPONSE_BYTES_MAX, TollgateClient,
    UNRECOGNISED_REASON, UsageEventPages, UsageQueryParams,
};
pub use stats::{LossReason, LossReport, Tally, WriterStats};
pub use writer::{Clock, LossCallback, RecordError, UsageWriter, WriterBuilder, WriterStopped};
