//! The subcommands that ask a running server, against the real binary:
//! `tollgate accounts` in each output format, following pages, `--limit`,
//! `--prefix`, and a server's refusal printed with its code.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{ADMIN, As, GATEWAY, Server, run};

async fn server_with_accounts() -> Server {
    let server = Server::start(&[], &[]).await;
    for (account_id, units) in [("acct-b", 50), ("acct-a", 1200), ("other", 0)] {
        server
            .ok(As::Admin, Method::POST, "/v1/accounts", Some(json!({"account_id": account_id})), StatusCode::CREATED)
            .await;
        if units > 0 {
            let credit = json!({"credit_id": "c1", "units": units});
            let path = format!("/v1/accounts/{account_id}/credits");
            server.ok(As::Admin, Method::POST, &path, Some(credit), StatusCode::CREATED).await;
        }
    }
    let lease = json!({"units": 200, "ttl": "PT60S"});
    server.ok(As::Gateway, Method::POST, "/v1/accounts/acct-a/leases", Some(lease), StatusCode::CREATED).await;
    server
}

/// `tollgate accounts ARGS` against `server`, its URL and token from the
/// environment.
async fn accounts(server: &Server, args: &[&str]) -> (bool, String, String) {
    let args: Vec<&str> = ["accounts"].into_iter().chain(args.iter().copied()).collect();
    run(&args, &[("TOLLGATE_URL", &server.base), ("TOLLGATE_ADMIN_TOKEN", ADMIN)]).await
}

#[tokio::test]
async fn accounts_prints_a_table_csv_or_json() {
    let server = server_with_accounts().await;

    let (ok, stdout, stderr) = accounts(&server, &[]).await;
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout,
        "ACCOUNT_ID  CREDITED  AVAILABLE  RESERVED  CONSUMED  OVERAGE  BILLED  ACTIVE_LEASES\n\
         acct-a          1200       1000       200         0        0       0              1\n\
         acct-b            50         50         0         0        0       0              0\n\
         other              0          0         0         0        0       0              0\n"
    );

    let (ok, stdout, stderr) = accounts(&server, &["--csv", "--prefix", "acct-"]).await;
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout,
        "account_id,credited,available,reserved,consumed,overage,billed,active_leases\r\n\
         acct-a,1200,1000,200,0,0,0,1\r\nacct-b,50,50,0,0,0,0,0\r\n"
    );

    // One page of one account at a time, stopped after two rows.
    let (ok, stdout, stderr) = accounts(&server, &["--json", "--limit", "2"]).await;
    assert!(ok, "{stderr}");
    let rows: Value = serde_json::from_str(&stdout).expect("one JSON document");
    let account = server.ok(As::Gateway, Method::GET, "/v1/accounts/acct-a", None, StatusCode::OK).await;
    let mut expected = account.clone();
    expected.as_object_mut().unwrap().remove("next_fence");
    assert_eq!(rows.as_array().unwrap().len(), 2);
    assert_eq!(rows[0], expected);
    assert_eq!(rows[1]["account_id"], "acct-b");

    let (ok, stdout, stderr) = accounts(&server, &["--json", "--prefix", "nobody"]).await;
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "[]\n");
    server.kill().await;
}

#[tokio::test]
async fn accounts_follows_every_page() {
    let server = Server::start(&[], &[]).await;
    let ids: Vec<String> = (0..1005).map(|i| format!("a{i:04}")).collect();
    for id in &ids {
        server.ok(As::Admin, Method::POST, "/v1/accounts", Some(json!({"account_id": id})), StatusCode::CREATED).await;
    }
    let (ok, stdout, stderr) = accounts(&server, &["--csv"]).await;
    assert!(ok, "{stderr}");
    let listed: Vec<&str> = stdout.lines().skip(1).map(|line| line.split(',').next().unwrap()).collect();
    assert_eq!(listed, ids.iter().map(String::as_str).collect::<Vec<_>>());
    let (ok, stdout, _) = accounts(&server, &["--csv", "--limit", "1002"]).await;
    assert!(ok);
    assert_eq!(stdout.lines().count(), 1 + 1002);
    server.kill().await;
}

#[tokio::test]
async fn a_refusal_is_printed_with_its_code_and_fails() {
    let server = Server::start(&[], &[]).await;
    let (ok, stdout, stderr) =
        run(&["accounts"], &[("TOLLGATE_URL", &server.base), ("TOLLGATE_ADMIN_TOKEN", GATEWAY)]).await;
    assert!(!ok);
    assert_eq!(stdout, "");
    assert!(stderr.contains("tollgate: error: forbidden (HTTP 403)"), "{stderr}");

    let (ok, _, stderr) = run(&["accounts", "--url", &server.base], &[]).await;
    assert!(!ok);
    assert!(stderr.contains("unauthorized (HTTP 401)"), "{stderr}");

    let (ok, _, stderr) = accounts(&server, &["--limit", "0"]).await;
    assert!(!ok);
    assert!(stderr.contains("--limit"), "{stderr}");
    let (ok, _, stderr) = accounts(&server, &["--json", "--csv"]).await;
    assert!(!ok);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    server.kill().await;

    let (ok, _, stderr) = run(&["accounts", "--url", "http://127.0.0.1:9", "--token", ADMIN], &[]).await;
    assert!(!ok);
    assert!(stderr.contains("tollgate: error: connect_failed"), "{stderr}");
}
