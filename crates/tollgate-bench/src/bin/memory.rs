//! Bytes `MemoryStore` keeps per active lease, per settled lease, per
//! accepted usage event without dimensions (its request ID is remembered)
//! and per accepted event with two dimensions, counted by a global allocator that tracks live heap
//! bytes. It is its own binary because the counting allocator is global and
//! would tax every other benchmark.
//!
//! Prints one JSON object on stdout.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use tollgate_bench::workload::{
    ACCOUNTS, BATCH_EVENTS, account_id, memory_fundings, memory_store, now, run_ready, ttl, two_dimensions,
};
use tollgate_core::UsageEvent;
use tollgate_store::{Store, UsageSink};

/// Live heap bytes. Signed, because a block freed here may have been
/// allocated before counting began.
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; only the
// byte count is added on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which is forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller upholds `dealloc`'s contract, which is forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc_zeroed`'s contract, which is forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller upholds `realloc`'s contract, which is forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Leases and request IDs per measurement unless the first argument says
/// otherwise: large enough that the fixed cost of the maps is negligible, and
/// between two table growths rather than just after one.
const ITEMS_DEFAULT: usize = 100_000;

/// The length of every request ID measured, a typical gateway-made ID.
const REQUEST_ID_LEN: usize = 16;

fn main() {
    let items: usize = std::env::args().nth(1).and_then(|arg| arg.parse().ok()).unwrap_or(ITEMS_DEFAULT);
    let store = memory_store(ACCOUNTS);
    let before = live();
    for i in 0..items {
        let issued = run_ready(store.acquire(&account_id(i % ACCOUNTS), 1, ttl(), now())).expect("acquire");
        drop(issued);
    }
    let active = (live() - before) as f64 / items as f64;
    drop(store);

    let store = memory_store(ACCOUNTS);
    let before = live();
    for i in 0..items {
        let account = account_id(i % ACCOUNTS);
        let issued = run_ready(store.acquire(&account, 1, ttl(), now())).expect("acquire");
        run_ready(store.release(&account, &issued.lease.lease_id, issued.capability.expose(), now())).expect("release");
    }
    let settled = (live() - before) as f64 / items as f64;
    drop(store);

    let request_id = event_bytes(items, false);
    let dimensioned = event_bytes(items, true);

    println!(
        "{{\"items\":{items},\"active_lease_bytes\":{active:.1},\"settled_lease_bytes\":{settled:.1},\"request_id_bytes\":{request_id:.1},\"request_id_len\":{REQUEST_ID_LEN},\"event_two_dimensions_bytes\":{dimensioned:.1}}}"
    );
}

/// Live bytes per accepted overage event over `items` events in batches of
/// 1000 on 10 accounts, journal entries included; with `dimensions`, every
/// event carries [`two_dimensions`] (`model` and `route`).
fn event_bytes(items: usize, dimensions: bool) -> f64 {
    let store = memory_store(10);
    let fundings = memory_fundings(&store, 10);
    let before = live();
    for batch_index in 0..items / BATCH_EVENTS {
        let batch: Vec<UsageEvent> = (0..BATCH_EVENTS)
            .map(|n| {
                let funding = &fundings[n % fundings.len()];
                UsageEvent {
                    request_id: format!("req-{:012}", batch_index * BATCH_EVENTS + n),
                    account_id: funding.account_id.clone(),
                    credential_id: funding.credential_id.clone(),
                    units: 1,
                    occurred_at: now(),
                    lease_id: None,
                    fencing_token: None,
                    dimensions: if dimensions { two_dimensions(n) } else { Default::default() },
                }
            })
            .collect();
        debug_assert!(batch.iter().all(|event| event.request_id.len() == REQUEST_ID_LEN));
        drop(run_ready(store.ingest(batch, now())).expect("ingest"));
    }
    let bytes = (live() - before) as f64 / items as f64;
    drop(store);
    bytes
}
