//! Counters, gauges and histograms in a `prometheus-client` registry, one per
//! server state, rendered in the Prometheus text format (version 0.0.4).
//!
//! Label values come only from closed sets, never from request data, so no
//! key, capability, token or identifier can appear in a label and the number
//! of series stays bounded. Each label set is a type here: its values are
//! enums ([`HttpMethod`], [`LeaseEvent`], [`PassResult`]), stable codes that
//! `tollgate_core` types return as `&'static str`, status codes, or the route
//! template the router matched (`unmatched` when none did), never the path.
//!
//! Every series is updated through the library's atomics and per-series
//! locks; no lock is shared by all requests.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::Method;
use jiff::Timestamp;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tollgate_core::{EventOutcome, IngestError, Outcome};
use tollgate_store::{AttemptResult, OutboxCounts, Store, UnlockedCounts, UnlockedOperation};

use crate::clock_check::ClockStatus;

/// Upper bounds of the latency histogram buckets, in seconds.
const LATENCY_BUCKETS_S: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// Writes a closed-set label value.
fn encode_label(encoder: &mut LabelValueEncoder<'_>, value: &'static str) -> std::fmt::Result {
    encoder.write_str(value)
}

/// Label values that are their type's `as_str` name, so the label and every
/// other place that names the value spell it alike.
macro_rules! label_values_by_name {
    ($($label:ty),+) => {$(
        impl EncodeLabelValue for $label {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
                encode_label(encoder, self.as_str())
            }
        }
    )+};
}

/// The request method, for the `method` label; methods the server does not
/// route are `other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Delete,
    Patch,
    Head,
    Options,
    Other,
}

impl HttpMethod {
    pub fn of(method: &Method) -> Self {
        match *method {
            Method::GET => HttpMethod::Get,
            Method::POST => HttpMethod::Post,
            Method::PUT => HttpMethod::Put,
            Method::DELETE => HttpMethod::Delete,
            Method::PATCH => HttpMethod::Patch,
            Method::HEAD => HttpMethod::Head,
            Method::OPTIONS => HttpMethod::Options,
            _ => HttpMethod::Other,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Head => "HEAD",
            HttpMethod::Options => "OPTIONS",
            HttpMethod::Other => "other",
        }
    }
}

/// What a lease went through, for `tollgate_leases_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseEvent {
    Acquired,
    Released,
    Consolidated,
    Reclaimed,
}

impl LeaseEvent {
    const ALL: [LeaseEvent; 4] =
        [LeaseEvent::Acquired, LeaseEvent::Released, LeaseEvent::Consolidated, LeaseEvent::Reclaimed];

    fn as_str(self) -> &'static str {
        match self {
            LeaseEvent::Acquired => "acquired",
            LeaseEvent::Released => "released",
            LeaseEvent::Consolidated => "consolidated",
            LeaseEvent::Reclaimed => "reclaimed",
        }
    }
}

label_values_by_name!(HttpMethod, LeaseEvent);

/// How a reclaim pass ended, for `tollgate_reclaim_passes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PassResult {
    Ok,
    Error,
}

impl EncodeLabelValue for PassResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encode_label(encoder, if *self == PassResult::Ok { "ok" } else { "error" })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HttpLabels {
    method: HttpMethod,
    /// A route template, or `unmatched`.
    route: String,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UsageEventLabels {
    /// `Outcome::code`.
    outcome: &'static str,
    /// `RejectReason::code` for a rejection; empty otherwise.
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BatchLabels {
    /// `ok`, or `IngestError::code`.
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LeaseLabels {
    event: LeaseEvent,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PassLabels {
    result: PassResult,
}

/// What one successful reclaim pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimCounts {
    pub reclaimed: u64,
    pub skipped: u64,
}

/// What a webhook attempt came to, for `tollgate_webhook_attempts_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AttemptLabels {
    /// `delivered`, `retried` (failed, attempted again later) or `failed`
    /// (failed past the give-up time).
    result: &'static str,
}

/// Upper bounds of the webhook delivery latency buckets, in seconds: from
/// the event to its delivery, retries included.
const DELIVERY_BUCKETS_S: [f64; 12] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0, 3600.0, 86400.0];

type LatencyFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;

/// The server's metrics. Cheap to update from any task.
pub struct Metrics {
    registry: Registry,
    http_requests: Family<HttpLabels, Counter>,
    http_latency: LatencyFamily,
    usage_events: Family<UsageEventLabels, Counter>,
    usage_batches: Family<BatchLabels, Counter>,
    leases: Family<LeaseLabels, Counter>,
    reclaim_passes: Family<PassLabels, Counter>,
    reclaim_skipped: Counter,
    reclaim_lag: Gauge<f64, AtomicU64>,
    /// Microseconds since the epoch of the last successful reclaim pass, or
    /// of startup before the first one, so a worker that never succeeds
    /// shows a growing lag.
    reclaim_since_us: AtomicI64,
    clock: Arc<ClockGauges>,
    webhooks: WebhookMetrics,
}

/// The webhook worker's series.
struct WebhookMetrics {
    attempts: Family<AttemptLabels, Counter>,
    latency: Histogram,
    deliveries: Family<DeliveryLabels, Gauge>,
}

impl WebhookMetrics {
    fn register(registry: &mut Registry) -> Self {
        let attempts: Family<AttemptLabels, Counter> = Family::default();
        for result in ["delivered", "retried", "failed"] {
            drop(attempts.get_or_create(&AttemptLabels { result }));
        }
        let latency = Histogram::new(DELIVERY_BUCKETS_S);
        let deliveries: Family<DeliveryLabels, Gauge> = Family::default();
        registry.register(
            "tollgate_webhook_deliveries",
            "Webhook deliveries by state: pending, delivered or failed, as the webhook worker last read them",
            deliveries.clone(),
        );
        registry.register(
            "tollgate_webhook_attempts",
            "Webhook delivery attempts by result: delivered, retried (attempted again later) or failed (given up)",
            attempts.clone(),
        );
        registry.register(
            "tollgate_webhook_delivery_seconds",
            "Seconds from an event to its delivery, retries included",
            latency.clone(),
        );
        Self { attempts, latency, deliveries }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DeliveryLabels {
    /// `DeliveryState::as_str`.
    state: &'static str,
}

impl Metrics {
    pub fn new(started_at: Timestamp) -> Self {
        let mut registry = Registry::default();
        let http_requests = Family::default();
        let http_latency: LatencyFamily = Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS_S));
        let usage_events = Family::default();
        let usage_batches = Family::default();
        let leases: Family<LeaseLabels, Counter> = Family::default();
        let reclaim_passes: Family<PassLabels, Counter> = Family::default();
        let reclaim_skipped = Counter::default();
        let reclaim_lag = Gauge::default();
        let clock = Arc::new(ClockGauges::default());
        // The lease events and pass results are shown from the start, at zero.
        for event in LeaseEvent::ALL {
            drop(leases.get_or_create(&LeaseLabels { event }));
        }
        for result in [PassResult::Ok, PassResult::Error] {
            drop(reclaim_passes.get_or_create(&PassLabels { result }));
        }
        registry.register(
            "tollgate_http_requests",
            "HTTP requests by method, route template and status",
            http_requests.clone(),
        );
        registry.register(
            "tollgate_http_request_duration_seconds",
            "HTTP request latency by method, route template and status",
            http_latency.clone(),
        );
        registry.register(
            "tollgate_usage_events",
            "Usage events by outcome and rejection reason",
            usage_events.clone(),
        );
        registry.register(
            "tollgate_usage_batches",
            "Usage batches by result: ok or the batch error code",
            usage_batches.clone(),
        );
        registry.register(
            "tollgate_leases",
            "Leases acquired, released, consolidated (as sources) and reclaimed",
            leases.clone(),
        );
        registry.register("tollgate_reclaim_passes", "Reclaim passes by result", reclaim_passes.clone());
        registry.register(
            "tollgate_reclaim_skipped",
            "Due leases reclaim passes skipped because their row or their account's row is corrupt, once per pass",
            reclaim_skipped.clone(),
        );
        registry.register(
            "tollgate_reclaim_lag_seconds",
            "Seconds since the last successful reclaim pass (or since startup)",
            reclaim_lag.clone(),
        );
        registry.register_collector(Box::new(clock.clone()));
        let webhooks = WebhookMetrics::register(&mut registry);
        Self {
            registry,
            http_requests,
            http_latency,
            usage_events,
            usage_batches,
            leases,
            reclaim_passes,
            reclaim_skipped,
            reclaim_lag,
            reclaim_since_us: AtomicI64::new(started_at.as_microsecond()),
            clock,
            webhooks,
        }
    }

    /// Adds the store's unlocked-path counts (`Store::unlocked_counts`), read
    /// at each scrape.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Self {
        self.registry.register_collector(Box::new(UnlockedCollector { store }));
        self
    }

    /// Records one finished request. `route` must be a route template (or a
    /// fixed placeholder), never the request path.
    pub fn observe_request(&self, method: HttpMethod, route: &str, status: u16, elapsed: Duration) {
        let labels = HttpLabels { method, route: route.to_owned(), status };
        self.http_requests.get_or_create(&labels).inc();
        self.http_latency.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    pub fn observe_outcomes(&self, outcomes: &[EventOutcome]) {
        for outcome in outcomes {
            let reason = match outcome.outcome {
                Outcome::Rejected(reason) => reason.code(),
                Outcome::Accepted | Outcome::Duplicate => "",
            };
            self.usage_events.get_or_create(&UsageEventLabels { outcome: outcome.outcome.code(), reason }).inc();
        }
        self.usage_batches.get_or_create(&BatchLabels { result: "ok" }).inc();
    }

    pub fn observe_batch_error(&self, error: &IngestError) {
        self.usage_batches.get_or_create(&BatchLabels { result: error.code() }).inc();
    }

    pub fn count_leases(&self, event: LeaseEvent, count: u64) {
        self.leases.get_or_create(&LeaseLabels { event }).inc_by(count);
    }

    /// A pass's result: how many leases it settled and how many it skipped
    /// as corrupt, or that it failed.
    pub fn observe_reclaim_pass(&self, result: Result<ReclaimCounts, ()>, now: Timestamp) {
        match result {
            Ok(counts) => {
                self.reclaim_passes.get_or_create(&PassLabels { result: PassResult::Ok }).inc();
                self.count_leases(LeaseEvent::Reclaimed, counts.reclaimed);
                self.reclaim_skipped.inc_by(counts.skipped);
                self.reclaim_since_us.store(now.as_microsecond(), Ordering::Relaxed);
            }
            Err(()) => {
                self.reclaim_passes.get_or_create(&PassLabels { result: PassResult::Error }).inc();
            }
        }
    }

    /// One webhook attempt's result; a delivery's latency runs from its
    /// event (`created_at`) to `now`.
    pub fn observe_webhook_attempt(&self, result: &AttemptResult, created_at: Timestamp, now: Timestamp) {
        let label = match result {
            AttemptResult::Delivered { .. } => {
                let latency = now.duration_since(created_at).as_secs_f64().max(0.0);
                self.webhooks.latency.observe(latency);
                "delivered"
            }
            AttemptResult::Retry { .. } => "retried",
            AttemptResult::Failed { .. } => "failed",
        };
        self.webhooks.attempts.get_or_create(&AttemptLabels { result: label }).inc();
    }

    /// The store's delivery counts by state.
    pub fn observe_deliveries(&self, counts: OutboxCounts) {
        for (state, count) in [("pending", counts.pending), ("delivered", counts.delivered), ("failed", counts.failed)]
        {
            self.webhooks
                .deliveries
                .get_or_create(&DeliveryLabels { state })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    pub fn observe_clock(&self, status: &ClockStatus) {
        *self.clock.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(*status);
    }

    /// When the last reclaim pass succeeded (or the server started).
    pub(crate) fn last_reclaim(&self) -> Option<Timestamp> {
        Timestamp::from_microsecond(self.reclaim_since_us.load(Ordering::Relaxed)).ok()
    }

    /// How many leases this server settled each way since it started.
    pub(crate) fn settled_leases(&self) -> [(&'static str, u64); 3] {
        [LeaseEvent::Released, LeaseEvent::Consolidated, LeaseEvent::Reclaimed]
            .map(|event| (event.as_str(), self.leases.get_or_create(&LeaseLabels { event }).get()))
    }

    /// The Prometheus text exposition of every metric at `now`.
    pub fn render(&self, now: Timestamp) -> String {
        let since_us = self.reclaim_since_us.load(Ordering::Relaxed);
        let lag_us = now.as_microsecond().saturating_sub(since_us).max(0);
        // Microseconds to seconds: exact below 2^53 µs, about 285 years.
        #[allow(clippy::cast_precision_loss)]
        self.reclaim_lag.set(lag_us as f64 / 1e6);
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The clock offset gauges, shown only where the store has a shared clock,
/// that is once a check has run. The last status sits behind a lock taken by
/// the clock check and by scrapes, never by requests.
#[derive(Debug, Default)]
struct ClockGauges {
    last: Mutex<Option<ClockStatus>>,
}

impl Collector for ClockGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let last = *self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(status) = last else { return Ok(()) };
        let seconds = [
            (
                "tollgate_clock_offset_seconds",
                "The database's clock minus this server's, at the last check.",
                status.sample.offset.as_secs_f64(),
            ),
            (
                "tollgate_clock_offset_uncertainty_seconds",
                "How far the true offset may be from it.",
                status.sample.uncertainty.as_secs_f64(),
            ),
        ];
        for (name, help, value) in seconds {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let skewed = ConstGauge::new(i64::from(status.skewed()));
        let help = "1 while the offset is beyond the bound and the server does not serve.";
        skewed.encode(encoder.encode_descriptor("tollgate_clock_skewed", help, None, skewed.metric_type())?)
    }
}

/// The store's unlocked-path counts by operation: how often a write found its
/// rows changed (a server's remembered rows go stale when another server
/// writes the account) and how often an operation fell back to the locking
/// path.
struct UnlockedCollector {
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for UnlockedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnlockedCollector")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

type UnlockedCount = fn(&UnlockedCounts, UnlockedOperation) -> u64;

impl Collector for UnlockedCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let counts = self.store.unlocked_counts();
        let series: [(&str, &str, UnlockedCount); 2] = [
            (
                "tollgate_store_stale_writes",
                "Unlocked writes that found their rows changed since the view decided on and wrote nothing \
                 (each one more round trip), by operation.",
                UnlockedCounts::stale_writes,
            ),
            (
                "tollgate_store_fallbacks",
                "Operations that left the unlocked path for the locking one, by operation.",
                UnlockedCounts::fallbacks,
            ),
        ];
        for (name, help, count) in series {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for operation in UnlockedOperation::ALL {
                let labels = OperationLabels { operation: operation.as_str() };
                ConstCounter::new(count(&counts, operation)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_in_seconds() {
        let metrics = Metrics::new(Timestamp::UNIX_EPOCH);
        metrics.observe_request(HttpMethod::Get, "/v1/leases/{lease_id}", 200, Duration::from_micros(400));
        metrics.observe_request(HttpMethod::Get, "/v1/leases/{lease_id}", 200, Duration::from_micros(3_000));
        let text = metrics.render(Timestamp::UNIX_EPOCH);
        let labels = r#"method="GET",route="/v1/leases/{lease_id}",status="200""#;
        for line in [
            format!("tollgate_http_requests_total{{{labels}}} 2"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"0.0005\"}} 1"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"0.0025\"}} 1"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"0.005\"}} 2"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"5\"}} 2"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} 2"),
            format!("tollgate_http_request_duration_seconds_count{{{labels}}} 2"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        // The sum is a float: 0.0034 give or take its last bit.
        let sum_prefix = format!("tollgate_http_request_duration_seconds_sum{{{labels}}} ");
        let sum: f64 = text.lines().find_map(|l| l.strip_prefix(&sum_prefix)).unwrap().parse().unwrap();
        assert!((sum - 0.0034).abs() < 1e-12, "{sum}");
    }

    #[test]
    fn reclaim_passes_count_skipped_corrupt_leases() {
        let metrics = Metrics::new(Timestamp::UNIX_EPOCH);
        metrics.observe_reclaim_pass(Ok(ReclaimCounts { reclaimed: 1, skipped: 2 }), Timestamp::UNIX_EPOCH);
        metrics.observe_reclaim_pass(Ok(ReclaimCounts { reclaimed: 0, skipped: 2 }), Timestamp::UNIX_EPOCH);
        let text = metrics.render(Timestamp::UNIX_EPOCH);
        for line in [
            "tollgate_reclaim_skipped_total 4",
            r#"tollgate_reclaim_passes_total{result="ok"} 2"#,
            r#"tollgate_reclaim_passes_total{result="error"} 0"#,
            r#"tollgate_leases_total{event="reclaimed"} 1"#,
            r#"tollgate_leases_total{event="consolidated"} 0"#,
            "# TYPE tollgate_reclaim_lag_seconds gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
