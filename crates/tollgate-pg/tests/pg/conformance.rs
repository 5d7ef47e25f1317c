//! The conformance suite, instantiated for `PostgresStore`: every case runs on
//! its own freshly created and migrated database, dropped with the store.
//! `partitioned` runs every case again on a database whose per-account tables
//! are all hash-partitioned by `account_id` (`TestDb::create_partitioned`),
//! the schema as a distributed engine shards it.

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

mod partitioned {
    use super::*;

    struct PartitionedPostgres;

    impl StoreFactory for PartitionedPostgres {
        type Store = PostgresStore;

        async fn create(&self, policy: GrantPolicy) -> PostgresStore {
            let store = PostgresStore::on_test_db(TestDb::create_partitioned().await, policy)
                .await
                .expect("a PostgresStore on a partitioned database");
            assert!(store.applied_migrations().is_empty(), "the partitioned database was not fully migrated");
            store
        }
    }

    tollgate_conformance::conformance_suite!(PartitionedPostgres);
}
