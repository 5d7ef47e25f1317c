//! Counters and histograms, rendered in the Prometheus text format.
//!
//! Label values come only from closed sets (route templates, status codes,
//! outcome classes, reason codes), never from request data, so no key,
//! capability, token or identifier can appear in a label and the number of
//! series stays bounded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use jiff::Timestamp;
use tollgate_core::{EventOutcome, IngestError, Outcome};

use crate::clock_check::ClockStatus;

/// Upper bounds of the latency histogram buckets, in microseconds.
const LATENCY_BUCKETS_US: [u64; 12] =
    [500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 5_000_000];

#[derive(Default, Clone)]
struct Histogram {
    /// Observations at or below each bucket bound (not cumulative; summed when
    /// rendered).
    buckets: [u64; LATENCY_BUCKETS_US.len()],
    count: u64,
    sum_us: u64,
}

impl Histogram {
    fn observe(&mut self, elapsed: Duration) {
        let elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Some(index) = LATENCY_BUCKETS_US.iter().position(|bound| elapsed_us <= *bound) {
            self.buckets[index] = self.buckets[index].saturating_add(1);
        }
        self.count = self.count.saturating_add(1);
        self.sum_us = self.sum_us.saturating_add(elapsed_us);
    }
}

/// What a lease went through, for `tollgate_leases_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LeaseEvent {
    Acquired,
    Released,
    Consolidated,
    Reclaimed,
}

impl LeaseEvent {
    fn as_str(self) -> &'static str {
        match self {
            LeaseEvent::Acquired => "acquired",
            LeaseEvent::Released => "released",
            LeaseEvent::Consolidated => "consolidated",
            LeaseEvent::Reclaimed => "reclaimed",
        }
    }
}

#[derive(Default)]
struct Registry {
    /// By `(method, route template, status)`.
    http: BTreeMap<(&'static str, String, u16), Histogram>,
    /// By `(outcome, reason)`; the reason is empty except for rejections.
    usage_events: BTreeMap<(&'static str, &'static str), u64>,
    /// By result: `ok` or the batch error code.
    usage_batches: BTreeMap<&'static str, u64>,
    leases: BTreeMap<LeaseEvent, u64>,
    /// By result: `ok` or `error`.
    reclaim_passes: BTreeMap<&'static str, u64>,
    /// Due leases passes skipped as corrupt (a lease skipped by several
    /// passes counts once per pass).
    reclaim_skipped: u64,
    reclaim_last_success: Option<Timestamp>,
    clock: Option<ClockStatus>,
}

/// What one successful reclaim pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimCounts {
    pub reclaimed: u64,
    pub skipped: u64,
}

/// The server's metrics. Cheap to update from any task.
pub struct Metrics {
    started_at: Timestamp,
    registry: Mutex<Registry>,
}

impl Metrics {
    pub fn new(started_at: Timestamp) -> Self {
        Self { started_at, registry: Mutex::new(Registry::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Metrics are plain counters; values written before a panic elsewhere
        // are still correct, so a poisoned lock is used as is.
        self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one finished request. `route` must be a route template (or a
    /// fixed placeholder), never the request path.
    pub fn observe_request(&self, method: &'static str, route: &str, status: u16, elapsed: Duration) {
        let mut registry = self.lock();
        registry.http.entry((method, route.to_owned(), status)).or_default().observe(elapsed);
    }

    pub fn observe_outcomes(&self, outcomes: &[EventOutcome]) {
        let mut registry = self.lock();
        for outcome in outcomes {
            let reason = match outcome.outcome {
                Outcome::Rejected(reason) => reason.code(),
                Outcome::Accepted | Outcome::Duplicate => "",
            };
            *registry.usage_events.entry((outcome.outcome.code(), reason)).or_default() += 1;
        }
        *registry.usage_batches.entry("ok").or_default() += 1;
    }

    pub fn observe_batch_error(&self, error: &IngestError) {
        *self.lock().usage_batches.entry(error.code()).or_default() += 1;
    }

    pub fn count_leases(&self, event: LeaseEvent, count: u64) {
        *self.lock().leases.entry(event).or_default() += count;
    }

    /// A pass's result: how many leases it settled and how many it skipped
    /// as corrupt, or that it failed.
    pub fn observe_reclaim_pass(&self, result: Result<ReclaimCounts, ()>, now: Timestamp) {
        let mut registry = self.lock();
        match result {
            Ok(counts) => {
                *registry.reclaim_passes.entry("ok").or_default() += 1;
                *registry.leases.entry(LeaseEvent::Reclaimed).or_default() += counts.reclaimed;
                registry.reclaim_skipped += counts.skipped;
                registry.reclaim_last_success = Some(now);
            }
            Err(()) => *registry.reclaim_passes.entry("error").or_default() += 1,
        }
    }

    pub fn observe_clock(&self, status: &ClockStatus) {
        self.lock().clock = Some(*status);
    }

    /// The Prometheus text exposition of every metric at `now`.
    pub fn render(&self, now: Timestamp) -> String {
        let registry = self.lock();
        let mut out = String::new();

        out.push_str("# HELP tollgate_http_requests_total HTTP requests by method, route template and status.\n");
        out.push_str("# TYPE tollgate_http_requests_total counter\n");
        for ((method, route, status), histogram) in &registry.http {
            let _ = writeln!(
                out,
                "tollgate_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {}",
                escape(route),
                histogram.count
            );
        }

        out.push_str("# HELP tollgate_http_request_duration_seconds HTTP request latency by method, route template and status.\n");
        out.push_str("# TYPE tollgate_http_request_duration_seconds histogram\n");
        for ((method, route, status), histogram) in &registry.http {
            let labels = format!("method=\"{method}\",route=\"{}\",status=\"{status}\"", escape(route));
            let mut cumulative = 0u64;
            for (bound_us, count) in LATENCY_BUCKETS_US.iter().zip(histogram.buckets) {
                cumulative += count;
                let _ = writeln!(
                    out,
                    "tollgate_http_request_duration_seconds_bucket{{{labels},le=\"{}\"}} {cumulative}",
                    seconds(*bound_us)
                );
            }
            let _ = writeln!(
                out,
                "tollgate_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                histogram.count
            );
            let _ =
                writeln!(out, "tollgate_http_request_duration_seconds_sum{{{labels}}} {}", seconds(histogram.sum_us));
            let _ = writeln!(out, "tollgate_http_request_duration_seconds_count{{{labels}}} {}", histogram.count);
        }

        out.push_str("# HELP tollgate_usage_events_total Usage events by outcome and rejection reason.\n");
        out.push_str("# TYPE tollgate_usage_events_total counter\n");
        for ((outcome, reason), count) in &registry.usage_events {
            let _ = writeln!(out, "tollgate_usage_events_total{{outcome=\"{outcome}\",reason=\"{reason}\"}} {count}");
        }

        out.push_str("# HELP tollgate_usage_batches_total Usage batches by result: ok or the batch error code.\n");
        out.push_str("# TYPE tollgate_usage_batches_total counter\n");
        for (result, count) in &registry.usage_batches {
            let _ = writeln!(out, "tollgate_usage_batches_total{{result=\"{result}\"}} {count}");
        }

        out.push_str(
            "# HELP tollgate_leases_total Leases acquired, released, consolidated (as sources) and reclaimed.\n",
        );
        out.push_str("# TYPE tollgate_leases_total counter\n");
        for event in [LeaseEvent::Acquired, LeaseEvent::Released, LeaseEvent::Consolidated, LeaseEvent::Reclaimed] {
            let count = registry.leases.get(&event).copied().unwrap_or(0);
            let _ = writeln!(out, "tollgate_leases_total{{event=\"{}\"}} {count}", event.as_str());
        }

        out.push_str("# HELP tollgate_reclaim_passes_total Reclaim passes by result.\n");
        out.push_str("# TYPE tollgate_reclaim_passes_total counter\n");
        for result in ["ok", "error"] {
            let count = registry.reclaim_passes.get(result).copied().unwrap_or(0);
            let _ = writeln!(out, "tollgate_reclaim_passes_total{{result=\"{result}\"}} {count}");
        }

        out.push_str(
            "# HELP tollgate_reclaim_skipped_total Due leases reclaim passes skipped because their row or their \
             account's row is corrupt, once per pass.\n",
        );
        out.push_str("# TYPE tollgate_reclaim_skipped_total counter\n");
        let _ = writeln!(out, "tollgate_reclaim_skipped_total {}", registry.reclaim_skipped);

        // Lag is measured from the last successful pass, or from startup before
        // the first one, so a worker that never succeeds shows a growing lag.
        let since = registry.reclaim_last_success.unwrap_or(self.started_at);
        let lag = now.duration_since(since);
        out.push_str(
            "# HELP tollgate_reclaim_lag_seconds Seconds since the last successful reclaim pass (or since startup).\n",
        );
        out.push_str("# TYPE tollgate_reclaim_lag_seconds gauge\n");
        let _ = writeln!(out, "tollgate_reclaim_lag_seconds {}", lag.as_secs_f64().max(0.0));

        // Only where the store has a shared clock.
        if let Some(clock) = registry.clock {
            out.push_str(
                "# HELP tollgate_clock_offset_seconds The database's clock minus this server's, at the last check.\n",
            );
            out.push_str("# TYPE tollgate_clock_offset_seconds gauge\n");
            let _ = writeln!(out, "tollgate_clock_offset_seconds {}", clock.sample.offset.as_secs_f64());
            out.push_str("# HELP tollgate_clock_offset_uncertainty_seconds How far the true offset may be from it.\n");
            out.push_str("# TYPE tollgate_clock_offset_uncertainty_seconds gauge\n");
            let _ =
                writeln!(out, "tollgate_clock_offset_uncertainty_seconds {}", clock.sample.uncertainty.as_secs_f64());
            out.push_str(
                "# HELP tollgate_clock_skewed 1 while the offset is beyond the bound and the server does not serve.\n",
            );
            out.push_str("# TYPE tollgate_clock_skewed gauge\n");
            let _ = writeln!(out, "tollgate_clock_skewed {}", u8::from(clock.skewed()));
        }
        out
    }
}

/// Microseconds as decimal seconds, without float rounding noise.
fn seconds(us: u64) -> String {
    let whole = us / 1_000_000;
    let fraction = us % 1_000_000;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Escapes a label value per the text format.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_in_seconds() {
        let metrics = Metrics::new(Timestamp::UNIX_EPOCH);
        metrics.observe_request("GET", "/v1/leases/{lease_id}", 200, Duration::from_micros(400));
        metrics.observe_request("GET", "/v1/leases/{lease_id}", 200, Duration::from_micros(3_000));
        let text = metrics.render(Timestamp::UNIX_EPOCH);
        let labels = r#"method="GET",route="/v1/leases/{lease_id}",status="200""#;
        for line in [
            format!("tollgate_http_requests_total{{{labels}}} 2"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"0.0005\"}} 1"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"0.0025\"}} 1"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"0.005\"}} 2"),
            format!("tollgate_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} 2"),
            format!("tollgate_http_request_duration_seconds_sum{{{labels}}} 0.0034"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert_eq!(seconds(5_000_000), "5");
        assert_eq!(escape("a\"b"), "a\\\"b");
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
            r#"tollgate_leases_total{event="reclaimed"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
