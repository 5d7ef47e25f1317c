//! The webhook worker: derives events from the journal and delivers them,
//! signed, to the endpoints that want them.
//!
//! Each tick derives every entry not yet derived (`Outbox::derive_events`,
//! bounded per tick), then claims as many due deliveries as it has free
//! slots and sends each in its own task: a slow receiver holds its slots
//! for at most the attempt timeout and never delays the request path, and
//! an endpoint with `IN_FLIGHT_PER_ENDPOINT_MAX` attempts under way gets no
//! more until one ends, so it cannot take the slots of the others. An
//! attempt that gets a 2xx is delivered; a network error, a timeout or any
//! other status is retried after a capped exponential wait with jitter
//! (`RetryPolicy`) until the give-up time, then failed. Redirects are not
//! followed and at most `RESPONSE_BYTES_MAX` of a response is read.
//!
//! Several servers on one database each run this worker: a delivery attempt
//! is claimed by one of them only (`Outbox::claim_deliveries`), and an
//! attempt whose server died is claimed again once its claim lapses, so
//! delivery is at least once.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use tokio::sync::{Semaphore, watch};
use tollgate_core::RetryPolicy;
use tollgate_core::alerts::signature_header;
use tollgate_store::{AttemptResult, ClaimedDelivery, DeliveryClaim, FinishedAttempt, WebhookKey};

use crate::AppState;

/// The most attempts under way at once, over all endpoints.
pub const IN_FLIGHT_MAX: usize = 32;
/// The most attempts under way at once to one endpoint.
pub const IN_FLIGHT_PER_ENDPOINT_MAX: usize = 4;
/// The most of a response body an attempt reads.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// Journal entries one derivation pass reads, and passes per tick.
const DERIVE_BATCH: u32 = 1_000;
const DERIVE_PASSES_MAX: u32 = 100;
/// How long past its attempt timeout a claim lasts before another server may
/// make the next attempt.
const CLAIM_MARGIN: Duration = Duration::from_secs(30);
/// How often the worker reads the store's delivery counts for the metrics.
const COUNT_INTERVAL: Duration = Duration::from_secs(15);
/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "tollgate-signature";

/// How the worker delivers.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Seals endpoint secrets at rest; without one, endpoints cannot be
    /// created and nothing is delivered (`webhook_key_missing`).
    pub key: Option<WebhookKey>,
    /// Whether endpoints may resolve to loopback, private or link-local
    /// addresses.
    pub allow_private: bool,
    pub attempt_timeout: Duration,
    pub retry: RetryPolicy,
    /// Time between ticks.
    pub interval: Duration,
}

impl Default for WebhookSettings {
    /// A random key (right for a store whose data dies with the process),
    /// private addresses allowed, attempts of 10 s, the default retries,
    /// ticks every second.
    fn default() -> Self {
        Self {
            key: Some(WebhookKey::random()),
            allow_private: true,
            attempt_timeout: Duration::from_secs(10),
            retry: RetryPolicy::DEFAULT,
            interval: Duration::from_secs(1),
        }
    }
}

/// Refuses names that resolve to an address that is not public.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let public: Vec<SocketAddr> = found.filter(|addr| is_public(addr.ip())).collect();
            if public.is_empty() {
                return Err("the host resolves to no public address (--webhook-allow-private=false)".into());
            }
            let addrs: Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

/// Whether `ip` is a public unicast address: not loopback, private,
/// link-local, unspecified, broadcast, documentation, shared or unique-local.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_multicast()
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some_and(|v4| !is_public(IpAddr::V4(v4))))
        }
    }
}

/// Sends attempts.
pub struct Sender {
    client: reqwest::Client,
    allow_private: bool,
}

impl Sender {
    pub fn new(settings: &WebhookSettings) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(settings.attempt_timeout)
            .user_agent(concat!("tollgate-webhooks/", env!("CARGO_PKG_VERSION")));
        if !settings.allow_private {
            builder = builder.dns_resolver(Arc::new(PublicOnly));
        }
        Ok(Self { client: builder.build()?, allow_private: settings.allow_private })
    }

    /// Makes one attempt: the status of a response, or why there was none.
    pub async fn send(&self, url: &str, signature: &str, delivery: &ClaimedDelivery) -> Result<u16, String> {
        let parsed = reqwest::Url::parse(url).map_err(|error| format!("invalid url: {error}"))?;
        if !self.allow_private && literal_is_private(&parsed) {
            return Err("the url names an address that is not public (--webhook-allow-private=false)".into());
        }
        let response = self
            .client
            .post(parsed)
            .header("content-type", "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header("tollgate-event-id", &delivery.event_id)
            .header("tollgate-delivery-id", &delivery.delivery_id)
            .header("tollgate-delivery-attempt", delivery.attempt.to_string())
            .body(delivery.body.clone())
            .send()
            .await
            .map_err(|error| describe(&error))?;
        let status = response.status().as_u16();
        drain(response).await;
        Ok(status)
    }
}

/// Whether the URL's host is an address literal that is not public (a name
/// is checked where it is resolved, by `PublicOnly`).
fn literal_is_private(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
    host.parse::<IpAddr>().is_ok_and(|ip| !is_public(ip))
}

/// Reads at most `RESPONSE_BYTES_MAX` of a response body, so that a
/// connection can be reused, and drops the rest.
async fn drain(mut response: reqwest::Response) {
    let mut read = 0usize;
    while read < RESPONSE_BYTES_MAX {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            _ => return,
        }
    }
}

/// The reason of a failed attempt, without the URL (which may hold a token).
fn describe(error: &reqwest::Error) -> String {
    let what = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else if error.is_redirect() {
        "redirected"
    } else {
        "request failed"
    };
    let mut source = std::error::Error::source(error);
    let mut detail = String::new();
    while let Some(cause) = source {
        detail = cause.to_string();
        source = cause.source();
    }
    if detail.is_empty() { what.to_owned() } else { format!("{what}: {detail}") }
}

/// What an attempt's outcome means for its delivery.
pub fn result_of(
    outcome: Result<u16, String>,
    delivery: &ClaimedDelivery,
    retry: &RetryPolicy,
    now: Timestamp,
) -> AttemptResult {
    let (error, status) = match outcome {
        Ok(status) if (200..300).contains(&status) => return AttemptResult::Delivered { status },
        Ok(status) => (format!("HTTP {status}"), Some(status)),
        Err(error) => (error, None),
    };
    match retry.after_failure(delivery.attempt, delivery.created_at, now, rand::random()) {
        Some(at) => AttemptResult::Retry { at, error, status },
        None => AttemptResult::Failed { error, status },
    }
}

/// Makes attempts: signs, sends and records.
struct Deliverer {
    state: AppState,
    sender: Sender,
    key: WebhookKey,
}

/// The worker's shared state across ticks.
struct Worker {
    deliverer: Deliverer,
    slots: Arc<Semaphore>,
    busy: Arc<Mutex<HashMap<String, usize>>>,
}

impl Worker {
    async fn tick(self: &Arc<Self>, count: bool) {
        if let Err(error) = derive(&self.deliverer.state).await {
            tracing::warn!(code = error.code(), %error, "deriving webhook events failed; retrying next tick");
        }
        if count {
            count_deliveries(&self.deliverer.state).await;
        }
        if let Err(error) = self.deliver().await {
            tracing::warn!(code = error.code(), %error, "claiming webhook deliveries failed; retrying next tick");
        }
    }

    async fn deliver(self: &Arc<Self>) -> Result<(), tollgate_core::Error> {
        let free = self.slots.available_permits();
        if free == 0 {
            return Ok(());
        }
        let busy: Vec<String> = {
            let busy = self.busy.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            busy.iter().filter(|(_, n)| **n >= IN_FLIGHT_PER_ENDPOINT_MAX).map(|(id, _)| id.clone()).collect()
        };
        let state = &self.deliverer.state;
        let limit = u32::try_from(free).unwrap_or(u32::MAX);
        let claimed = state
            .store()
            .claim_deliveries(DeliveryClaim { limit, claim_for: claim_for(state), skip: &busy }, state.now())
            .await?;
        for delivery in claimed {
            let Ok(permit) = self.slots.clone().try_acquire_owned() else { break };
            *self
                .busy
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .entry(delivery.endpoint_id.clone())
                .or_default() += 1;
            let worker = self.clone();
            tokio::spawn(async move {
                worker.deliverer.attempt(&delivery).await;
                let mut busy = worker.busy.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if let Some(n) = busy.get_mut(&delivery.endpoint_id) {
                    *n -= 1;
                    if *n == 0 {
                        busy.remove(&delivery.endpoint_id);
                    }
                }
                drop(permit);
            });
        }
        Ok(())
    }
}

/// How long a claim lasts: the attempt's timeout and a margin.
fn claim_for(state: &AppState) -> SignedDuration {
    SignedDuration::try_from(state.webhooks().attempt_timeout + CLAIM_MARGIN).unwrap_or(SignedDuration::MAX)
}

impl Deliverer {
    fn new(state: &AppState) -> Result<Deliverer, String> {
        let settings = state.webhooks();
        let key = settings.key.clone().ok_or("no webhook key (--webhook-key): webhook deliveries are off")?;
        let sender = Sender::new(settings).map_err(|error| format!("cannot build the webhook client: {error}"))?;
        Ok(Deliverer { state: state.clone(), sender, key })
    }

    /// Signs and sends one claimed attempt and records its result.
    async fn attempt(&self, delivery: &ClaimedDelivery) {
        let outcome = match self.sign(delivery) {
            Ok(signature) => self.sender.send(&delivery.url, &signature, delivery).await,
            Err(error) => Err(error.to_string()),
        };
        let now = self.state.now();
        let result = result_of(outcome, delivery, &self.state.webhooks().retry, now);
        self.state.metrics().observe_webhook_attempt(&result, delivery.created_at, now);
        let recorded = self
            .state
            .store()
            .finish_delivery(
                FinishedAttempt { delivery_id: &delivery.delivery_id, attempt: delivery.attempt, result },
                now,
            )
            .await;
        if let Err(error) = recorded {
            tracing::warn!(code = error.code(), %error, "recording a webhook attempt failed; it will be attempted again");
        }
    }

    fn sign(&self, delivery: &ClaimedDelivery) -> Result<String, tollgate_core::Error> {
        let secrets =
            delivery.sealed_secrets.iter().map(|sealed| self.key.open(sealed)).collect::<Result<Vec<_>, _>>()?;
        let timestamp = self.state.now().as_second();
        Ok(signature_header(secrets.iter().map(Vec::as_slice), timestamp, delivery.body.as_bytes()))
    }
}

/// Derives every entry not yet derived, in bounded passes.
pub async fn derive(state: &AppState) -> Result<u64, tollgate_core::Error> {
    let mut derived = 0u64;
    for _ in 0..DERIVE_PASSES_MAX {
        let batch = state.store().derive_events(DERIVE_BATCH).await?;
        derived += u64::from(batch);
        if batch < DERIVE_BATCH {
            break;
        }
    }
    Ok(derived)
}

/// Derives every entry not yet derived, then makes one attempt of every
/// delivery due now, up to `IN_FLIGHT_MAX`, waiting for each to end.
/// Returns how many attempts it made. The worker does the same without
/// waiting; this form is for operators' tools and tests, which need to know
/// when the attempts are over.
pub async fn deliver_due(state: &AppState) -> Result<usize, tollgate_core::Error> {
    derive(state).await?;
    let deliverer = Deliverer::new(state).map_err(tollgate_core::Error::StorageUnavailable)?;
    let limit = u32::try_from(IN_FLIGHT_MAX).unwrap_or(u32::MAX);
    let claimed = state
        .store()
        .claim_deliveries(DeliveryClaim { limit, claim_for: claim_for(state), skip: &[] }, state.now())
        .await?;
    futures_util::future::join_all(claimed.iter().map(|delivery| deliverer.attempt(delivery))).await;
    count_deliveries(state).await;
    Ok(claimed.len())
}

/// Reads the store's delivery counts into the metrics.
async fn count_deliveries(state: &AppState) {
    match state.store().outbox_counts().await {
        Ok(counts) => state.metrics().observe_deliveries(counts),
        Err(error) => tracing::warn!(code = error.code(), %error, "cannot count webhook deliveries"),
    }
}

/// Runs ticks until `stop` turns true. Without a key there is nothing it can
/// sign, so it does not start. Attempts under way at the stop are left to
/// their claims: another server, or this one restarted, attempts them again.
pub async fn run(state: AppState, stop: watch::Receiver<bool>) {
    let deliverer = match Deliverer::new(&state) {
        Ok(deliverer) => deliverer,
        Err(why) => {
            tracing::info!("{why}");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let worker = Arc::new(Worker { deliverer, slots, busy: Arc::default() });
    // The first tick comes one interval after start, like every other.
    let interval = state.webhooks().interval;
    let ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    let mut counted = Instant::now() - COUNT_INTERVAL;
    crate::worker::tick_until_stopped(ticker, stop, || {
        let count = counted.elapsed() >= COUNT_INTERVAL;
        if count {
            counted = Instant::now();
        }
        let worker = Arc::clone(&worker);
        async move { worker.tick(count).await }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn only_public_unicast_addresses_are_public() {
        for private in ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.1.1", "0.0.0.0", "100.64.0.1"] {
            assert!(!is_public(private.parse::<Ipv4Addr>().unwrap().into()), "{private}");
        }
        for private in ["::1", "fc00::1", "fe80::1", "::", "::ffff:127.0.0.1"] {
            assert!(!is_public(private.parse::<Ipv6Addr>().unwrap().into()), "{private}");
        }
        assert!(is_public("93.184.216.34".parse::<Ipv4Addr>().unwrap().into()));
        assert!(is_public("2606:2800:220:1::1".parse::<Ipv6Addr>().unwrap().into()));
    }

    fn claimed(attempt: u32) -> ClaimedDelivery {
        ClaimedDelivery {
            delivery_id: "dlv".into(),
            endpoint_id: "whe".into(),
            event_id: "evt".into(),
            attempt,
            url: "http://127.0.0.1/".into(),
            sealed_secrets: Vec::new(),
            body: "{}".into(),
            created_at: Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_2xx_delivers_and_anything_else_retries_until_the_give_up_time() {
        let retry = RetryPolicy::DEFAULT;
        let now = Timestamp::UNIX_EPOCH;
        assert_eq!(result_of(Ok(204), &claimed(1), &retry, now), AttemptResult::Delivered { status: 204 });
        assert!(matches!(result_of(Ok(301), &claimed(1), &retry, now), AttemptResult::Retry { status: Some(301), .. }));
        assert!(matches!(result_of(Err("timed out".into()), &claimed(1), &retry, now), AttemptResult::Retry { .. }));
        let late = now.checked_add(SignedDuration::from_hours(25)).unwrap();
        assert!(matches!(
            result_of(Ok(500), &claimed(9), &retry, late),
            AttemptResult::Failed { status: Some(500), .. }
        ));
    }
}
