//! The server's handler tests, as one test binary: every route through
//! `router()` over a `MemoryStore` with a settable clock.

mod bodies;
mod connections;
mod handlers;
mod idempotency;
mod openapi;
mod scoped;
mod support;
mod worker;
