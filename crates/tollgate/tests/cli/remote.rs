//! The subcommands that ask a running server, against the real binary:
//! `tollgate accounts` in each output format, following pages, `--limit`,
//! `--prefix`, and a server's refusal printed with its code.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{ADMIN, Api, As, GATEWAY, Server, run};

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
    server.acquire("acct-a", 200, "PT60S").await;
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

/// `acct-a` with a credential and three overage events in two hours, two of
/// them with a `model`.
async fn server_with_usage() -> Server {
    let server = server_with_accounts().await;
    let issued = server.issue_credential("acct-a", "gw").await;
    let credential_id = issued["credential_id"].as_str().expect("a credential id");
    let event = |request_id: &str, units: u64, at: &str, dimensions: Value| {
        json!({"request_id": request_id, "account_id": "acct-a", "credential_id": credential_id,
               "units": units, "occurred_at": at, "dimensions": dimensions})
    };
    let events = json!({"events": [
        event("r1", 7, "2026-01-01T00:10:00Z", json!({"model": "m1"})),
        event("r2", 5, "2026-01-01T01:20:00Z", json!({"model": "m2"})),
        event("r3", 3, "2026-01-01T01:30:00Z", json!({})),
    ]});
    let outcomes = server.report_usage(events).await;
    assert!(outcomes.to_string().matches("accepted").count() == 3, "{outcomes}");
    server
}

async fn remote(server: &Server, args: &[&str]) -> (bool, String, String) {
    run(args, &[("TOLLGATE_URL", &server.base), ("TOLLGATE_ADMIN_TOKEN", ADMIN)]).await
}

#[tokio::test]
async fn usage_prints_one_row_per_bucket_and_group() {
    let server = server_with_usage().await;
    let range = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T02:00:00Z"];
    let args: Vec<&str> =
        [&["usage", "acct-a"][..], &range, &["--window", "PT1H", "--group-by", "dimension:model", "--csv"]].concat();
    let (ok, stdout, stderr) = remote(&server, &args).await;
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout,
        "start,end,group,units,events\r\n\
         2026-01-01T00:00:00Z,2026-01-01T01:00:00Z,m1,7,1\r\n\
         2026-01-01T01:00:00Z,2026-01-01T02:00:00Z,,3,1\r\n\
         2026-01-01T01:00:00Z,2026-01-01T02:00:00Z,m2,5,1\r\n"
    );

    // The whole range as one bucket; an empty range of days shows its days.
    let args: Vec<&str> = [&["usage", "acct-a"][..], &range, &["--json"]].concat();
    let (ok, stdout, stderr) = remote(&server, &args).await;
    assert!(ok, "{stderr}");
    let rows: Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(
        rows,
        json!([{"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T02:00:00Z", "group": "",
                             "units": "15", "events": "3"}])
    );
    let args = ["usage", "acct-b", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-03T00:00:00Z", "--window", "P1D"];
    let (ok, stdout, stderr) = remote(&server, &args).await;
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 3, "a header and two empty days:\n{stdout}");

    // Refusals carry their codes, from the command line or from the server.
    let (ok, _, stderr) = remote(&server, &["usage", "acct-a", "--window", "P1W"]).await;
    assert!(!ok && stderr.contains("invalid_window"), "{stderr}");
    let args = ["usage", "acct-a", "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z"];
    let (ok, _, stderr) = remote(&server, &args).await;
    assert!(!ok && stderr.contains("invalid_range (HTTP 400)"), "{stderr}");
    let (ok, _, stderr) = remote(&server, &["usage", "nobody"]).await;
    assert!(!ok && stderr.contains("account_not_found (HTTP 404)"), "{stderr}");
    server.kill().await;
}

#[tokio::test]
async fn journal_prints_every_change_with_signed_deltas() {
    let server = server_with_usage().await;
    let (ok, stdout, stderr) = remote(&server, &["journal", "acct-a", "--json"]).await;
    assert!(ok, "{stderr}");
    let rows: Value = serde_json::from_str(&stdout).expect("one JSON document");
    let rows = rows.as_array().expect("rows");
    let kinds: Vec<&str> = rows.iter().map(|row| row["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["credit", "acquire", "usage"]);
    assert_eq!((rows[0]["seq"].clone(), rows[0]["credited"].clone()), (json!(1), json!(1200)));
    assert_eq!(rows[0]["ids"], "credit:c1");
    assert_eq!((rows[1]["available"].clone(), rows[1]["reserved"].clone()), (json!(-200), json!(200)));
    assert_eq!((rows[2]["overage"].clone(), rows[2]["billed"].clone()), (json!(15), json!(15)));
    assert_eq!(rows[2]["ids"], "events:3");

    let (ok, stdout, stderr) = remote(&server, &["journal", "acct-a", "--after", "1", "--limit", "1"]).await;
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[1].starts_with("  2  acquire") && lines[1].contains("-200") && lines[1].contains("+200"), "{stdout}");
    let (ok, _, stderr) = remote(&server, &["journal", "nobody"]).await;
    assert!(!ok && stderr.contains("account_not_found (HTTP 404)"), "{stderr}");
    server.kill().await;
}
