//! The walk on the memory store, and what the first run looks like.

use reqwest::{Method, StatusCode};

use crate::support::{Api, As, Server};
use crate::walk::{self, Backend, SERVE_ARGS};

#[tokio::test]
async fn walk_on_the_memory_store() {
    let server = Server::start(&SERVE_ARGS, &[]).await;
    assert!(server.banner.iter().any(|l| l.starts_with("store: memory")), "{:?}", server.banner);
    walk::walk(&server, Backend { name: "memory", units_max: u64::MAX }).await;
    let (stopped, stderr) = server.terminate().await;
    assert!(stopped, "SIGTERM is a clean stop:\n{stderr}");
}

/// With no tokens configured, the memory store generates both, prints them
/// once, and they work.
#[tokio::test]
async fn first_run_needs_no_setup() {
    let server =
        Server::spawn_on("127.0.0.1:0", &[], &[]).await.unwrap_or_else(|(status, stderr)| panic!("{status}: {stderr}"));
    let token = |name: &str| {
        server
            .banner
            .iter()
            .find_map(|line| line.trim().strip_prefix(&format!("{name}=")).map(str::to_owned))
            .unwrap_or_else(|| panic!("{name} is printed: {:?}", server.banner))
    };
    let admin = token("TOLLGATE_ADMIN_TOKEN");
    let gateway = token("TOLLGATE_GATEWAY_TOKEN");
    assert_ne!(admin, gateway);
    assert!(server.banner.iter().any(|l| l.starts_with("store: memory")));
    let (status, _) = server.send(Some(&admin), Method::GET, "/v1/admin/check", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = server.send(Some(&gateway), Method::GET, "/v1/admin/check", Vec::new()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = server.call(As::Nobody, Method::GET, "/healthz", None).await;
    assert_eq!((status, body), (StatusCode::OK, serde_json::json!({"status": "ok"})));
    let (stopped, stderr) = server.terminate().await;
    assert!(stopped, "{stderr}");
    assert!(!stderr.contains(&admin) && !stderr.contains(&gateway), "tokens are never logged:\n{stderr}");
}
