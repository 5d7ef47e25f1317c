//! The HTTP pair: a load generator that runs the acquire + release cycle over
//! HTTP/1.1 keep-alive connections, and the baseline server it is also pointed
//! at, which parses the same JSON and answers with constants. Loopback only.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Json;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tollgate_api::{AcquireRequest, ReleaseRequest};

const LEASE_BODY: &str = concat!(
    r#"{"lease_id":"lse_00000000000000000000000000000000","account_id":"http-0","fencing_token":1,"#,
    r#""capability":"tgc_0000000000000000000000000000000000000000000000000000000000000000","#,
    r#""granted":1,"used":0,"state":"active","expires_at":"2027-01-01T00:00:00Z","expiry_is_upper_bound":false}"#
);

const RELEASE_BODY: &str = concat!(
    r#"{"lease":{"lease_id":"lse_00000000000000000000000000000000","account_id":"http-0","fencing_token":1,"#,
    r#""granted":1,"used":0,"state":"released","expires_at":"2027-01-01T00:00:00Z","expiry_is_upper_bound":false},"#,
    r#""charged":0,"returned":1,"excess":0}"#
);

/// Serves the two routes of the cycle with constant bodies after parsing the
/// request JSON into the same wire types Tollgate uses. Prints the bound
/// address as `tollgate serve` does.
pub async fn baseline_server(listen: SocketAddr) -> anyhow::Result<()> {
    async fn acquire(Path(_account_id): Path<String>, Json(request): Json<AcquireRequest>) -> impl IntoResponse {
        std::hint::black_box(request);
        (StatusCode::CREATED, [(CONTENT_TYPE, "application/json")], LEASE_BODY)
    }
    async fn release(
        Path((_account_id, _lease_id)): Path<(String, String)>,
        Json(request): Json<ReleaseRequest>,
    ) -> impl IntoResponse {
        std::hint::black_box(request);
        ([(CONTENT_TYPE, "application/json")], RELEASE_BODY)
    }
    let router = axum::Router::new()
        .route("/v1/accounts/{account_id}/leases", post(acquire))
        .route("/v1/accounts/{account_id}/leases/{lease_id}/release", post(release));
    let listener = TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}

/// Load generator settings.
pub struct LoadConfig {
    /// The servers; connection `i` goes to the `i mod n`-th of `n`.
    pub addresses: Vec<SocketAddr>,
    pub connections: usize,
    /// Accounts `http-0 … http-(accounts-1)`. The connections form
    /// `connections / n` slots (connection `i` is in slot `i / n`), and the
    /// connections of slot `s`, one per server, all cycle through `http-s`,
    /// `http-(s + slots)`, …: with one server each connection has accounts of
    /// its own, with several the servers write the same accounts.
    pub accounts: usize,
    pub duration: Duration,
    pub gateway_token: String,
    /// When set, the accounts are created and credited first
    /// through the admin routes (an existing account is fine).
    pub admin_token: Option<String>,
    /// With the admin token: each account the load creates gets one
    /// `available_below` alert rule, which the load never crosses, and the
    /// first creation adds a webhook endpoint for balance events, so that
    /// every change is judged against a rule as a deployment with alerts is.
    pub alert_rules: bool,
}

/// Where the benchmark's webhook endpoint points: the discard port. No
/// event is ever sent there, since no rule is crossed.
const BENCH_WEBHOOK: &str =
    r#"{"url":"http://127.0.0.1:9/hook","event_types":["balance.threshold_crossed","balance.recovered"]}"#;

pub struct LoadReport {
    pub requests_per_second: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub requests: u64,
}

#[derive(Deserialize)]
struct Lease {
    account_id: String,
    lease_id: String,
    capability: Option<String>,
}

pub(crate) type Sender = http1::SendRequest<Full<Bytes>>;

/// One HTTP/1 connection to `address`, which must be on loopback: the
/// benchmarks load only servers on this machine.
pub(crate) async fn open(address: SocketAddr) -> anyhow::Result<Sender> {
    if !address.ip().is_loopback() {
        bail!("the benchmarks only target loopback addresses, not {address}");
    }
    let stream = TcpStream::connect(address).await.with_context(|| format!("connecting to {address}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn post_json(sender: &mut Sender, token: &str, path: &str, body: String) -> anyhow::Result<(u16, Bytes)> {
    sender.ready().await?;
    let request = Request::post(path)
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

async fn create_accounts(config: &LoadConfig, admin_token: &str) -> anyhow::Result<()> {
    let mut sender = open(config.addresses[0]).await?;
    for index in 0..config.accounts.max(config.connections) {
        let account = format!("http-{index}");
        let (status, body) =
            post_json(&mut sender, admin_token, "/v1/accounts", format!(r#"{{"account_id":"{account}"}}"#)).await?;
        if status != 201 && status != 409 {
            bail!("creating {account}: {status} {}", String::from_utf8_lossy(&body));
        }
        if status == 201 && config.alert_rules {
            add_alert_rule(&mut sender, admin_token, &account, index == 0).await?;
        }
        let path = format!("/v1/accounts/{account}/credits");
        let (status, body) =
            post_json(&mut sender, admin_token, &path, r#"{"credit_id":"bench","units":1000000000000}"#.to_owned())
                .await?;
        if status != 201 && status != 200 {
            bail!("crediting {account}: {status} {}", String::from_utf8_lossy(&body));
        }
    }
    Ok(())
}

/// One alert rule on a new account, and the endpoint with the first one.
async fn add_alert_rule(sender: &mut Sender, admin_token: &str, account: &str, first: bool) -> anyhow::Result<()> {
    let path = format!("/v1/accounts/{account}/alert-rules");
    let rule = r#"{"condition":"available_below","threshold":1000}"#.to_owned();
    let (status, body) = post_json(sender, admin_token, &path, rule).await?;
    if status != 201 {
        bail!("adding an alert rule to {account}: {status} {}", String::from_utf8_lossy(&body));
    }
    if first {
        let (status, body) = post_json(sender, admin_token, "/v1/webhooks", BENCH_WEBHOOK.to_owned()).await?;
        if status != 201 {
            bail!("adding the webhook endpoint: {status} {}", String::from_utf8_lossy(&body));
        }
    }
    Ok(())
}

/// Runs acquire + release cycles on every connection until the duration is up.
/// Every request counts, and each request's latency is recorded.
pub async fn load(config: LoadConfig) -> anyhow::Result<LoadReport> {
    if config.addresses.is_empty() {
        bail!("the load generator needs at least one server address");
    }
    if let Some(admin_token) = &config.admin_token {
        create_accounts(&config, admin_token).await?;
    }
    let start = Instant::now();
    let deadline = start + config.duration;
    let mut workers = Vec::new();
    let servers = config.addresses.len();
    let slots = (config.connections / servers).max(1);
    let accounts = config.accounts.max(slots);
    for index in 0..config.connections {
        let mut sender = open(config.addresses[index % servers]).await?;
        let token = config.gateway_token.clone();
        let acquire_body = acquire_request_body()?;
        let acquire_paths: Vec<String> = (index / servers % slots..accounts)
            .step_by(slots)
            .map(|a| format!("/v1/accounts/http-{a}/leases"))
            .collect();
        workers.push(tokio::spawn(async move {
            // Bounded by the duration: at most one entry per request sent.
            let mut latencies_us: Vec<u32> = Vec::with_capacity(1 << 16);
            for acquire_path in acquire_paths.iter().cycle() {
                if Instant::now() >= deadline {
                    break;
                }
                let sent = Instant::now();
                let (status, body) = post_json(&mut sender, &token, acquire_path, acquire_body.clone()).await?;
                latencies_us.push(sent.elapsed().as_micros() as u32);
                if status != 201 {
                    bail!("acquire: {status} {}", String::from_utf8_lossy(&body));
                }
                let lease: Lease = serde_json::from_slice(&body)?;
                let capability = lease.capability.context("an acquire response carries the capability")?;
                let release = serde_json::to_string(&ReleaseRequest { capability })?;
                let sent = Instant::now();
                let path = format!("/v1/accounts/{}/leases/{}/release", lease.account_id, lease.lease_id);
                let (status, body) = post_json(&mut sender, &token, &path, release).await?;
                latencies_us.push(sent.elapsed().as_micros() as u32);
                if status != 200 {
                    bail!("release: {status} {}", String::from_utf8_lossy(&body));
                }
            }
            anyhow::Ok(latencies_us)
        }));
    }
    let mut latencies_us = Vec::new();
    for worker in workers {
        latencies_us.extend(worker.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies_us.sort_unstable();
    let quantile = |q: f64| -> u64 {
        if latencies_us.is_empty() {
            return 0;
        }
        let index = ((latencies_us.len() - 1) as f64 * q).round() as usize;
        u64::from(latencies_us[index])
    };
    Ok(LoadReport {
        requests_per_second: latencies_us.len() as f64 / elapsed,
        p50_us: quantile(0.50),
        p99_us: quantile(0.99),
        requests: latencies_us.len() as u64,
    })
}

/// The acquire request, serialised from the wire type the baseline parses.
fn acquire_request_body() -> anyhow::Result<String> {
    Ok(serde_json::to_string(&AcquireRequest { units: 1, ttl: jiff::SignedDuration::from_secs(60) })?)
}
