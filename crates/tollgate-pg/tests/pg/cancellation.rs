//! Every `PostgresStore` operation dropped at every step takes effect whole or
//! not at all, and leaves no session of the pool inside a transaction (see
//! `tollgate_conformance::cancellation`). Both layers are tested: the store
//! as callers get it, whose operations run to completion in tasks of their
//! own, and the operations run inline, where a drop stops them mid-way and
//! only the connection handling keeps the pool clean.

use std::time::Duration;

use sqlx::PgPool;
use tollgate_conformance::cancellation::{Harness, drop_at_every_step};
use tollgate_conformance::support::{secs, with_grace};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;

struct Postgres {
    store: PostgresStore,
    /// A connection of its own, to look at the store's sessions.
    observer: PgPool,
}

/// Sessions of the store's database, other than the observer's, that are
/// inside a transaction without running a statement.
async fn idle_in_transaction(observer: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(observer)
    .await
    .expect("pg_stat_activity readable")
}

impl Harness for Postgres {
    type Store = PostgresStore;

    fn store(&self) -> &PostgresStore {
        &self.store
    }

    async fn settle(&self) {
        self.store.settled().await;
        // A connection closed on drop is closed by a task of its own; give
        // it a bounded time to go. One left in a transaction never goes.
        for _ in 0..500 {
            if idle_in_transaction(&self.observer).await == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("a session of the pool stayed idle in a transaction");
    }
}

async fn harness(inline: bool) -> Postgres {
    let db = TestDb::create().await;
    let observer = db.new_pool(1).await;
    let store = PostgresStore::on_test_db(db, with_grace(secs(1))).await.expect("store");
    let store = if inline { store.inline() } else { store };
    Postgres { store, observer }
}

#[tokio::test]
async fn every_operation_dropped_at_every_step_runs_to_completion() {
    drop_at_every_step(&harness(false).await).await;
}

#[tokio::test]
async fn operations_stopped_mid_way_leave_no_session_in_a_transaction() {
    drop_at_every_step(&harness(true).await).await;
}
