//! The client's tests, in one binary: against the real `tollgate` binary,
//! every route, the usage writer's failure scenarios and the gateway helper
//! through a fault-injecting proxy; and the writer over a store used directly
//! behind a scripted faulty sink (`direct_writer`).
//!
//! Each test starts its own server on port 0 (and, for PostgreSQL, gets its
//! own database), so tests run in parallel without seeing each other.
//! PostgreSQL tests need `DATABASE_URL`; run them through
//! `scripts/with-postgres cargo nextest run -p tollgate-client`. Without a
//! database they fail and say how to get one.

mod direct_writer;
mod faults;
mod gateway;
mod gateway_faults;
mod journal;
mod listings;
mod postgres;
mod retries;
mod routes;
mod support;
mod usage_queries;
mod writer;
mod writer_faults;
