//! Concurrent gateway load under faults, against real `tollgate serve`
//! processes, and what must hold afterwards.
//!
//! Each client owns one account and runs lease cycles: acquire, report three
//! usage events against the lease, release. A client retries every request
//! whose answer it did not get (a transport error, a hang-up of its own, a
//! retryable 5xx) until it gets one, so at the end it knows every write the
//! servers acknowledged. Retries are idempotent: acquire and release carry an
//! `Idempotency-Key`, usage events their request ids. Some requests are hung up on purpose: sent with a
//! timeout of a millisecond or two, so the client goes away mid-request.
//!
//! [`verify`] then checks, per account: every acknowledged lease is stored;
//! no fencing token was issued twice; nothing stays reserved (no retry
//! granted a second lease); `billed` equals the units of the events
//! the client saw accepted (first accepted, or duplicate of an accepted one);
//! every conservation equation holds and `check` is clean.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{ADMIN, GATEWAY};

/// What one client saw acknowledged.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub account_id: String,
    /// Acknowledged leases: `(lease_id, fencing_token)`.
    pub leases: Vec<(String, u64)>,
    /// Units of events the servers classified as accepted or duplicate.
    pub accepted_units: u64,
}

/// Counts of what happened to requests, for the report.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub requests: AtomicU64,
    pub lost_answers: AtomicU64,
    pub hang_ups: AtomicU64,
}

/// The servers a client may talk to; it moves to the next after a failure.
#[derive(Clone)]
pub(crate) struct Targets(pub Arc<Vec<String>>);

pub(crate) struct Load {
    pub targets: Targets,
    pub clients: usize,
    pub rounds: usize,
    /// One request in this many is hung up; 0 for none.
    pub hang_up_every: u64,
    pub tally: Arc<Tally>,
}

/// How long a client keeps retrying one request before the test fails: long
/// enough for a server or PostgreSQL restart.
const RETRIES_MAX: u32 = 600;
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Longer than any server's request timeout here (the default 30 s): a
/// server that has not answered by then is stuck, which is a failure.
const ANSWER_WAIT_MAX: Duration = Duration::from_secs(45);

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(ANSWER_WAIT_MAX).build().expect("an HTTP client")
}

/// Sends one request until a server answers it with something other than a
/// retryable error; returns that answer.
async fn answered(
    http: &reqwest::Client,
    targets: &Targets,
    tally: &Tally,
    hang_up_every: u64,
    path: &str,
    body: &Value,
    key: Option<&str>,
) -> (StatusCode, Value) {
    let mut target = 0usize;
    for _ in 0..RETRIES_MAX {
        let n = tally.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let base = &targets.0[target % targets.0.len()];
        let mut request = http.post(format!("{base}{path}")).bearer_auth(GATEWAY).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let hang_up = hang_up_every > 0 && n.is_multiple_of(hang_up_every);
        if hang_up {
            tally.hang_ups.fetch_add(1, Ordering::Relaxed);
            request = request.timeout(Duration::from_millis(1 + n % 2));
        }
        let outcome = match request.send().await {
            Err(error) if error.is_timeout() && !hang_up => {
                panic!("POST {base}{path} got no answer within {ANSWER_WAIT_MAX:?}: the server is stuck")
            }
            Ok(response) => {
                let status = response.status();
                match response.bytes().await {
                    Ok(bytes) => Some((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))),
                    Err(_) => None,
                }
            }
            Err(_) => None,
        };
        match outcome {
            Some((status, body)) if !(status.is_server_error() && body["error"]["retryable"] == true) => {
                return (status, body);
            }
            _ => {
                tally.lost_answers.fetch_add(1, Ordering::Relaxed);
                target += 1;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
    panic!("no server answered POST {path} after {RETRIES_MAX} attempts");
}

/// Creates `count` funded accounts, each with a credential, through `admin`.
pub(crate) async fn accounts(base: &str, prefix: &str, count: usize, units: u64) -> Vec<(String, String)> {
    let http = client();
    let mut made = Vec::new();
    for i in 0..count {
        let account_id = format!("{prefix}-{i}");
        let post = |path: String, body: Value| {
            let http = http.clone();
            async move {
                let response =
                    http.post(format!("{base}{path}")).bearer_auth(ADMIN).json(&body).send().await.expect("answer");
                assert!(response.status().is_success(), "{path}: {}", response.status());
                response.json::<Value>().await.expect("JSON")
            }
        };
        post("/v1/accounts".to_owned(), json!({"account_id": account_id})).await;
        post(format!("/v1/accounts/{account_id}/credits"), json!({"credit_id": "funds", "units": units})).await;
        let credential = post(format!("/v1/accounts/{account_id}/credentials"), json!({"label": "gateway"})).await;
        made.push((account_id, credential["credential_id"].as_str().expect("credential id").to_owned()));
    }
    made
}

impl Load {
    /// Runs every client to the end; returns what each saw.
    pub(crate) async fn run(&self, accounts: &[(String, String)]) -> Vec<Seen> {
        let mut tasks = Vec::new();
        for (client_index, (account_id, credential_id)) in accounts.iter().cloned().enumerate().take(self.clients) {
            let targets = self.targets.clone();
            let tally = Arc::clone(&self.tally);
            let (rounds, hang_up_every) = (self.rounds, self.hang_up_every);
            tasks.push(tokio::spawn(async move {
                let http = client();
                let mut seen = Seen { account_id: account_id.clone(), ..Seen::default() };
                for round in 0..rounds {
                    // Acquire and release carry an idempotency key, the same on
                    // every retry, so a lost answer never grants or settles twice.
                    let send = |path: String, body: Value, key: Option<String>| {
                        let (http, targets, tally) = (http.clone(), targets.clone(), Arc::clone(&tally));
                        async move {
                            let key = key.as_deref();
                            answered(&http, &targets, &tally, hang_up_every, &path, &body, key).await
                        }
                    };
                    let (status, lease) = send(
                        format!("/v1/accounts/{account_id}/leases"),
                        json!({"units": 10, "ttl": "PT10M"}),
                        Some(format!("acquire-c{client_index}-r{round}")),
                    )
                    .await;
                    assert_eq!(status, StatusCode::CREATED, "acquire: {lease}");
                    let lease_id = lease["lease_id"].as_str().expect("lease id").to_owned();
                    let fence = lease["fencing_token"].as_u64().expect("fence");
                    seen.leases.push((lease_id.clone(), fence));

                    let events: Vec<Value> = (0..3)
                        .map(|k| {
                            json!({"request_id": format!("c{client_index}-r{round}-e{k}"), "account_id": account_id,
                                   "credential_id": credential_id, "units": 1 + k,
                                   "occurred_at": "2030-01-01T00:00:00Z",
                                   "lease_id": lease_id, "fencing_token": fence})
                        })
                        .collect();
                    let (status, answer) = send("/v1/usage".to_owned(), json!({ "events": events }), None).await;
                    assert_eq!(status, StatusCode::OK, "usage: {answer}");
                    for (k, outcome) in answer["outcomes"].as_array().expect("outcomes").iter().enumerate() {
                        match outcome["outcome"].as_str() {
                            Some("accepted" | "duplicate") => seen.accepted_units += 1 + k as u64,
                            _ => panic!("usage event rejected under load: {outcome}"),
                        }
                    }

                    let (status, released) = send(
                        format!("/v1/accounts/{account_id}/leases/{lease_id}/release"),
                        json!({"capability": lease["capability"]}),
                        Some(format!("release-c{client_index}-r{round}")),
                    )
                    .await;
                    assert_eq!(status, StatusCode::OK, "release: {released}");
                }
                seen
            }));
        }
        let mut all = Vec::new();
        for task in tasks {
            all.push(task.await.expect("client task"));
        }
        all
    }
}

/// Checks everything the module documentation promises, through `base`.
pub(crate) async fn verify(base: &str, seen: &[Seen]) {
    let http = client();
    // Reads are retried like writes: a pooled PostgreSQL connection that died
    // while idle fails the one request that next uses it, retryably.
    let get = |path: String| {
        let http = http.clone();
        async move {
            for _ in 0..RETRIES_MAX {
                let response = http.get(format!("{base}{path}")).bearer_auth(ADMIN).send().await.expect("answer");
                let answer = (response.status(), response.json::<Value>().await.expect("JSON"));
                if !(answer.0.is_server_error() && answer.1["error"]["retryable"] == true) {
                    return answer;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            panic!("GET {path} kept failing");
        }
    };
    for client in seen {
        let mut fences = BTreeSet::new();
        for (lease_id, fence) in &client.leases {
            let (status, lease) = get(format!("/v1/accounts/{}/leases/{lease_id}", client.account_id)).await;
            assert_eq!(status, StatusCode::OK, "acknowledged lease {lease_id} is missing: {lease}");
            assert_eq!(lease["fencing_token"], *fence, "{lease}");
            assert!(fences.insert(*fence), "fence {fence} issued twice on {}", client.account_id);
        }
        let (status, account) = get(format!("/v1/accounts/{}", client.account_id)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(account["billed"], client.accepted_units, "billed on {}: {account}", client.account_id);
        let counters: BTreeMap<&str, u64> = ["credited", "available", "reserved", "consumed"]
            .into_iter()
            .map(|name| (name, account[name].as_u64().expect("counter")))
            .collect();
        assert_eq!(
            counters["credited"],
            counters["available"] + counters["reserved"] + counters["consumed"],
            "{account}"
        );
        // Every lease was released, and no retry granted a second lease for
        // one acquire: nothing stays reserved.
        assert_eq!((counters["reserved"], &account["active_leases"]), (0, &json!(0)), "{account}");
    }
    let (status, check) = get("/v1/admin/check".to_owned()).await;
    assert_eq!(status, StatusCode::OK, "{check}");
    assert_eq!(check["ok"], true, "{check}");
}
