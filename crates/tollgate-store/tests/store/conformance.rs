//! The conformance suite, instantiated for the in-memory store.

use tollgate_conformance::StoreFactory;
use tollgate_core::GrantPolicy;
use tollgate_store::MemoryStore;

struct Memory;

impl StoreFactory for Memory {
    type Store = MemoryStore;

    async fn create(&self, policy: GrantPolicy) -> MemoryStore {
        MemoryStore::new(policy)
    }
}

tollgate_conformance::conformance_suite!(Memory);
