//! The client against the real `tollgate` binary: every route, the usage
//! writer's four failure scenarios, and the gateway helper.
//!
//! Each test starts its own server on port 0 (and, for PostgreSQL, gets its
//! own database), so tests run in parallel without seeing each other.
//! PostgreSQL tests need `DATABASE_URL`; run them through
//! `scripts/with-postgres cargo nextest run -p tollgate-client`. Without a
//! database they fail and say how to get one.

mod faults;
mod gateway;
mod gateway_faults;
mod postgres;
mod retries;
mod routes;
mod support;
mod writer;
mod writer_faults;
