//! The memory store's integration tests, one binary: the conformance suite
//! and the cancellation suite, each instantiated for `MemoryStore`.

mod cancellation;
mod conformance;
