//! The reclaim worker: passes run again while they come back full, bounded per
//! tick, and the passes show in the metrics.

use axum::http::{Method, StatusCode};
use jiff::SignedDuration;
use std::sync::Arc;
use tollgate_core::GrantPolicy;
use tollgate_server::Limits;
use tollgate_server::worker::{PASSES_PER_TICK_MAX, reclaim_tick};
use tollgate_store::MemoryStore;

use crate::support::{Api, App, As};

/// A store whose reclaim passes settle at most `batch` leases, and `leases`
/// one-second leases on one account, all past their boundary.
async fn due_leases(batch: u32, leases: u64) -> App {
    let policy = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::ZERO, batch).unwrap();
    let app = App::with_store(Arc::new(MemoryStore::new(policy)), Limits::default());
    app.funded("acct", leases).await;
    for _ in 0..leases {
        app.acquire("acct", 1, "PT1S").await;
    }
    app.clock.set(crate::support::start() + SignedDuration::from_secs(1));
    app
}

#[tokio::test]
async fn a_tick_runs_passes_until_one_is_not_full() {
    let app = due_leases(2, 5).await;
    assert_eq!(reclaim_tick(&app.state).await, Ok(5));
    assert_eq!(reclaim_tick(&app.state).await, Ok(0));
    let account = app.ok(As::Gateway, Method::GET, "/v1/accounts/acct", None, StatusCode::OK).await;
    assert_eq!((account["available"].as_u64(), account["reserved"].as_u64()), (Some(5), Some(0)));
    let text = app.call(As::Nobody, Method::GET, "/metrics", None).await.1;
    let text = text.as_str().unwrap();
    // Three passes (2 + 2 + 1) in the first tick, one empty pass in the second.
    for line in [r#"tollgate_reclaim_passes_total{result="ok"} 4"#, r#"tollgate_leases_total{event="reclaimed"} 5"#] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}

#[tokio::test]
async fn a_tick_stops_at_its_pass_bound() {
    let leases = u64::from(PASSES_PER_TICK_MAX) + 1;
    let app = due_leases(1, leases).await;
    assert_eq!(reclaim_tick(&app.state).await, Ok(u64::from(PASSES_PER_TICK_MAX)));
    assert_eq!(reclaim_tick(&app.state).await, Ok(1));
}
