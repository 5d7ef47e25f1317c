//! The memory pairs: `MemoryStore` against the `HashMap` model, one thread.
//!
//! `bench/run` runs each side alone (`--exact memory_lease/tollgate`, then
//! `memory_lease/model`, and so on) for several interleaved rounds, so the two
//! sides of a pair never share a measurement window. Every sample starts from a
//! fresh store, because settled leases and request IDs are kept forever and a
//! store grown by millions of earlier iterations would measure the allocator.
//!
//! The `tollgate` sides run with one alert rule on every account, as a
//! deployment with balance alerts does; `tollgate_plain` is the same store
//! without rules, to measure what the rules cost.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate_bench::workload::{
    self, ACCOUNTS, BATCH_ACCOUNTS, BatchMaker, account_id, memory_fundings, memory_store, now, run_ready, ttl,
};
use tollgate_core::Condition;
use tollgate_store::{NewAlertRule, Outbox, Store, UsageSink};

/// Accounts the ingestion batches rotate over: ten groups of ten.
const INGEST_ACCOUNTS: usize = 10 * BATCH_ACCOUNTS;

/// A store of `accounts` accounts, each with one `available_below` alert
/// rule that the benchmark never crosses, when `alerts` is set: every change
/// is then judged against a rule.
fn store_with(accounts: usize, alerts: bool) -> tollgate_store::MemoryStore {
    let store = memory_store(accounts);
    if alerts {
        for index in 0..accounts {
            let account_id = account_id(index);
            let rule = NewAlertRule { account_id: &account_id, condition: Condition::AvailableBelow { units: 1_000 } };
            run_ready(store.create_alert_rule(rule, now())).expect("rule");
        }
    }
    store
}

fn lease_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_lease");
    for (side, alerts) in [("tollgate", true), ("tollgate_plain", false)] {
        lease_side(&mut group, side, alerts);
    }
    group.bench_function("model", |b| {
        b.iter_custom(|iters| {
            let (mut model, _) = workload::model(ACCOUNTS, 0);
            let accounts: Vec<String> = (0..ACCOUNTS).map(account_id).collect();
            let start = Instant::now();
            for i in 0..iters as usize {
                let grant = model.acquire(&accounts[i % ACCOUNTS], 1, ttl(), now()).expect("acquire");
                black_box(model.release(&grant.lease_id, &grant.capability, now()).expect("release"));
            }
            start.elapsed()
        })
    });
    group.finish();
}

fn lease_side(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, side: &str, alerts: bool) {
    group.bench_function(side, |b| {
        b.iter_custom(|iters| {
            let store = store_with(ACCOUNTS, alerts);
            let accounts: Vec<String> = (0..ACCOUNTS).map(account_id).collect();
            let start = Instant::now();
            for i in 0..iters as usize {
                let issued = run_ready(store.acquire(&accounts[i % ACCOUNTS], 1, ttl(), now())).expect("acquire");
                let released = run_ready(store.release(
                    &issued.lease.account_id,
                    &issued.lease.lease_id,
                    issued.capability.expose(),
                    now(),
                ))
                .expect("release");
                black_box(released);
            }
            start.elapsed()
        })
    });
}

fn ingest_batches(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_ingest");
    for (side, alerts) in [("tollgate", true), ("tollgate_plain", false)] {
        ingest_side(&mut group, side, alerts);
    }
    group.bench_function("model", |b| {
        b.iter_custom(|iters| {
            let (mut model, fundings) = workload::model(INGEST_ACCOUNTS, INGEST_ACCOUNTS);
            let mut batches = BatchMaker::new(fundings, "req");
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                let batch = batches.next_batch();
                let start = Instant::now();
                // The store consumes its batch, so the model drops its own inside the
                // timed region too.
                let outcomes = model.ingest(&batch, now()).expect("ingest");
                drop(batch);
                elapsed += start.elapsed();
                black_box(outcomes);
            }
            elapsed
        })
    });
    group.finish();
}

fn ingest_side(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, side: &str, alerts: bool) {
    group.bench_function(side, |b| {
        b.iter_custom(|iters| {
            let store = store_with(INGEST_ACCOUNTS, alerts);
            let mut batches = BatchMaker::new(memory_fundings(&store, INGEST_ACCOUNTS), "req");
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                let batch = batches.next_batch();
                let start = Instant::now();
                let outcomes = run_ready(store.ingest(batch, now())).expect("ingest");
                elapsed += start.elapsed();
                black_box(outcomes);
            }
            elapsed
        })
    });
}

criterion_group!(benches, lease_cycle, ingest_batches);
criterion_main!(benches);
