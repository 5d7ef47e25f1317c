//! Tollgate's benchmarks. Every figure `bench/run` reports is a ratio of a
//! Tollgate path to a baseline measured in the same run, interleaved, on the
//! same machine: absolute numbers on a shared machine mean little.

pub mod console;
pub mod gateway;
pub mod http;
pub mod model;
pub mod pg;
pub mod report;
pub mod roundtrips;
pub mod workload;
