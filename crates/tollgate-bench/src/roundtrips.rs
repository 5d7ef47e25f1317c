//! Counts the round trips sqlx makes, once statements are prepared: sqlx
//! reports every statement it executes as a `sqlx::query` event except BEGIN,
//! and this layer counts those events, plus one BEGIN per COMMIT or ROLLBACK,
//! while a count is open. While none is open it declines the events, so
//! sqlx does not even format them and timed runs pay nothing measurable.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

const TARGET: &str = "sqlx::query";

struct StatementCounter;

impl<S: Subscriber> Layer<S> for StatementCounter {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.target() == TARGET { Interest::sometimes() } else { Interest::never() }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        metadata.target() == TARGET && COUNTING.load(Ordering::Relaxed)
    }

    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut summary = Summary(false);
        event.record(&mut summary);
        // sqlx sends BEGIN as a queued simple query that it waits for but does
        // not report, so every transaction end stands for one more round trip.
        let round_trips = if summary.0 { 2 } else { 1 };
        STATEMENTS.fetch_add(round_trips, Ordering::Relaxed);
    }
}

/// Whether an event's `summary` field is a COMMIT or ROLLBACK.
struct Summary(bool);

impl Visit for Summary {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "summary" {
            self.0 |= ends_transaction(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 |= ends_transaction(format!("{value:?}").trim_matches('"'));
        }
    }
}

fn ends_transaction(summary: &str) -> bool {
    let word = summary.split_whitespace().next().unwrap_or("");
    word.eq_ignore_ascii_case("COMMIT") || word.eq_ignore_ascii_case("ROLLBACK")
}

/// An open count; `finish` closes it and returns the statements sent since
/// `start`. Only one count is open at a time, and the operations counted run
/// one after another.
pub struct Counting(());

pub fn start() -> Counting {
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(StatementCounter);
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
    });
    STATEMENTS.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    Counting(())
}

impl Counting {
    pub fn finish(self) -> u64 {
        COUNTING.store(false, Ordering::Relaxed);
        STATEMENTS.load(Ordering::Relaxed)
    }
}
