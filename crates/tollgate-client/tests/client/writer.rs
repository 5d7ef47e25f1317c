//! The usage writer over HTTP against a real server on the memory store:
//! normal flow, a refused batch, and shutdown with the server gone.

use std::time::Duration;

use tokio::time::Instant;
use tollgate_client::{LossReason, Tally};

use crate::support::{
    KillingSink, LEASE_TTL, Server, Storage, TIMER_TICK, Tenant, assert_accounted, assert_ledger, writer, writer_config,
};

#[tokio::test]
async fn normal_flow_every_event_accepted_and_billed_exactly_once() {
    let server = Server::start(&Storage::Memory).await;
    let admin = server.admin();
    let tenant = Tenant::create(&admin, "acct-normal", 100_000).await;
    let lease = server.gateway().acquire(&tenant.account_id, 5_000, LEASE_TTL).await.unwrap();
    let sink = KillingSink::new(server.gateway(), None, None);
    let (writer, losses) = writer(sink.clone(), writer_config(16));

    let mut leased_units = 0;
    for n in 0..200u64 {
        let units = n % 9;
        let event = if n.is_multiple_of(4) {
            tenant.overage(&format!("normal-{n}"), units)
        } else {
            leased_units += units;
            tenant.leased(&format!("normal-{n}"), units, &lease.lease_id, lease.fencing_token)
        };
        writer.record(event).unwrap();
    }
    let stats = writer.shutdown(Duration::from_secs(60)).await.unwrap();

    assert_accounted(&stats);
    assert_eq!(stats.accepted, stats.recorded);
    assert_eq!(stats.lost_total(), Tally::default());
    assert!(losses.lock().unwrap().is_empty());
    assert_eq!(u64::from(sink.calls()), stats.attempts);
    assert_eq!(stats.batches, 13, "200 events in batches of at most 16");
    assert_ledger(&admin, &tenant.account_id, &stats).await;
    assert_eq!(admin.lease(&lease.account_id, &lease.lease_id).await.unwrap().used, leased_units);
    let activity = admin.credential(&tenant.account_id, &tenant.credential_id).await.unwrap().activity;
    assert_eq!((u128::from(activity.accepted_units), activity.accepted_events), (stats.accepted.units, 200));
}

#[tokio::test]
async fn a_batch_refused_for_overflow_is_lost_once_and_never_retried() {
    let server = Server::start(&Storage::Memory).await;
    let admin = server.admin();
    let tenant = Tenant::create(&admin, "acct-refused", 10).await;
    let sink = KillingSink::new(server.gateway(), None, None);
    let (writer, losses) = writer(sink.clone(), writer_config(2));

    // Each fits u64; together they overflow `billed`, so the server answers 422.
    writer.record(tenant.overage("huge", u64::MAX)).unwrap();
    writer.record(tenant.overage("one-more", 1)).unwrap();
    writer.record(tenant.overage("after", 3)).unwrap();
    let stats = writer.flush().await.unwrap();

    assert_accounted(&stats);
    assert_eq!(sink.calls(), 2, "the refused batch was sent once");
    let overflow = u128::from(u64::MAX) + 1;
    assert_eq!(stats.lost_for(LossReason::BatchRefused), Tally { events: 2, units: overflow });
    assert_eq!(stats.accepted, Tally { events: 1, units: 3 });
    {
        let losses = losses.lock().unwrap();
        assert_eq!(losses.len(), 1, "{losses:#?}");
        assert_eq!((losses[0].reason, losses[0].error_code), (LossReason::BatchRefused, Some("batch_refused")));
        assert_eq!((losses[0].units, losses[0].attempts, losses[0].maybe_applied), (overflow, 1, false));
    }

    // Flushing and shutting down never resend it or report it again.
    writer.flush().await.unwrap();
    let stats = writer.shutdown(Duration::from_secs(10)).await.unwrap();
    assert_eq!(sink.calls(), 2);
    assert_eq!(losses.lock().unwrap().len(), 1);
    assert_accounted(&stats);
    assert_ledger(&admin, &tenant.account_id, &stats).await;
    assert_eq!(admin.account(&tenant.account_id).await.unwrap().billed, 3);
}

#[tokio::test]
async fn shutdown_with_the_server_gone_reports_everything_left_lost_by_the_deadline() {
    let mut server = Server::start(&Storage::Memory).await;
    let admin = server.admin();
    let tenant = Tenant::create(&admin, "acct-gone", 10).await;
    let sink = KillingSink::new(server.gateway(), None, None);
    let (writer, losses) = writer(sink.clone(), writer_config(5));
    for n in 0..5 {
        writer.record(tenant.overage(&format!("before-{n}"), 1)).unwrap();
    }
    let delivered = writer.flush().await.unwrap();
    assert_eq!(delivered.accepted, Tally { events: 5, units: 5 });
    assert_ledger(&admin, &tenant.account_id, &delivered).await;

    server.kill().await;
    // From here on time is virtual: backoffs and the deadline pass without
    // real waiting, and "by the deadline" is exact rather than a threshold.
    tokio::time::pause();
    for n in 0..12 {
        writer.record(tenant.overage(&format!("after-{n}"), 2)).unwrap();
    }
    let timeout = Duration::from_secs(20);
    let started = Instant::now();
    let stats = writer.shutdown(timeout).await.unwrap();

    // Tokio's timers fire on millisecond ticks, so the deadline can be
    // observed up to one tick late; in virtual time that bound is exact.
    assert!(started.elapsed() <= timeout + TIMER_TICK, "{:?}", started.elapsed());
    assert_accounted(&stats);
    assert_eq!(stats.accepted, Tally { events: 5, units: 5 });
    assert_eq!(stats.lost_total(), Tally { events: 12, units: 24 });
    assert_eq!(stats.lost_for(LossReason::ShutdownDeadline), Tally { events: 12, units: 24 });
    let losses = losses.lock().unwrap();
    assert_eq!(losses.iter().map(|report| report.events.len()).collect::<Vec<_>>(), [5, 5, 2]);
    assert!(losses[0].maybe_applied && losses[0].attempts > 1, "the first batch was being retried: {:#?}", losses[0]);
    assert!(losses[1..].iter().all(|report| !report.maybe_applied && report.attempts == 0));
}
