//! Every `MemoryStore` operation dropped at every step takes effect whole or
//! not at all (see `tollgate_conformance::cancellation`).

use tollgate_conformance::cancellation::{Harness, drop_at_every_step};
use tollgate_conformance::support::{secs, with_grace};
use tollgate_store::MemoryStore;

struct Memory(MemoryStore);

impl Harness for Memory {
    type Store = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.0
    }

    /// An operation holds the store's lock within one poll and awaits
    /// nothing, so there is nothing to wait for.
    async fn settle(&self) {}
}

#[tokio::test]
async fn every_operation_dropped_at_every_step_is_whole_or_absent() {
    drop_at_every_step(&Memory(MemoryStore::new(with_grace(secs(1))))).await;
}
