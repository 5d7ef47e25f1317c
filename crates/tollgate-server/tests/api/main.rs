//! The server's tests, as one test binary: every route through `router()`
//! over a `MemoryStore` with a settable clock, and (`clock`) a server on a
//! real PostgreSQL whose clock is offset from the database's.

mod bodies;
mod clock;
mod connections;
mod console;
mod console_browser;
mod handlers;
mod idempotency;
mod journal;
mod listings;
mod openapi;
mod scoped;
mod store_metrics;
mod support;
mod usage_queries;
mod webhooks;
mod worker;
