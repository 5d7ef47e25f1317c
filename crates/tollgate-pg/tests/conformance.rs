//! The conformance suite, instantiated for `PostgresStore`: every case runs on
//! its own freshly created and migrated database, dropped with the store.

use tollgate_conformance::StoreFactory;
use tollgate_core::GrantPolicy;
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;

struct Postgres;

impl StoreFactory for Postgres {
    type Store = PostgresStore;

    async fn create(&self, policy: GrantPolicy) -> PostgresStore {
        PostgresStore::on_test_db(TestDb::create().await, policy).await.expect("a PostgresStore on a fresh database")
    }
}

tollgate_conformance::conformance_suite!(Postgres);
