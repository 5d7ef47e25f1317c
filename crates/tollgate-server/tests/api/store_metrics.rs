//! The store's unlocked-path counts on `/metrics`: zero on the memory store,
//! which has no unlocked path, and on PostgreSQL a stale write counted when
//! another server changed the row this one remembered.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::json;
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_server::Clock;
use tollgate_store::Store;

use crate::support::{Api, App, As, policy};

async fn metrics(app: &App) -> String {
    let (status, text) = app.call(As::Admin, Method::GET, "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    text.as_str().expect("the metrics are text").to_owned()
}

fn has(text: &str, line: &str) {
    assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
}

#[tokio::test]
async fn the_memory_store_reports_no_stale_writes_or_fallbacks() {
    let text = metrics(&App::new()).await;
    for operation in ["acquire", "release", "reclaim"] {
        has(&text, &format!(r#"tollgate_store_stale_writes_total{{operation="{operation}"}} 0"#));
        has(&text, &format!(r#"tollgate_store_fallbacks_total{{operation="{operation}"}} 0"#));
    }
    has(&text, "# TYPE tollgate_store_fallbacks_total counter");
}

#[tokio::test]
async fn another_servers_write_makes_this_ones_next_acquire_a_counted_stale_write() {
    let db = TestDb::create().await;
    let other_pool = db.new_pool(2).await;
    let store = PostgresStore::on_test_db(db, policy()).await.expect("store");
    let other = PostgresStore::from_pool(other_pool, policy()).await.expect("the other server's store");
    let app = App::with_store(Arc::new(store), tollgate_server::Limits::default());
    app.funded("acct", 100).await;
    let acquire = json!({"units": 1, "ttl": "PT1M"});
    let path = "/v1/accounts/acct/leases";
    app.ok(As::Gateway, Method::POST, path, Some(acquire.clone()), StatusCode::CREATED).await;
    other.acquire("acct", 1, jiff::SignedDuration::from_secs(60), app.clock.now()).await.expect("acquired there");
    has(&metrics(&app).await, r#"tollgate_store_stale_writes_total{operation="acquire"} 0"#);

    let lease = app.ok(As::Gateway, Method::POST, path, Some(acquire), StatusCode::CREATED).await;
    assert_eq!(lease["fencing_token"], 3, "decided on the committed row: {lease}");
    let text = metrics(&app).await;
    has(&text, r#"tollgate_store_stale_writes_total{operation="acquire"} 1"#);
    has(&text, r#"tollgate_store_fallbacks_total{operation="acquire"} 0"#);
}
