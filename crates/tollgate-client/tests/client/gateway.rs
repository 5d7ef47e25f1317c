//! The gateway helper against a real server: leases per account, local
//! spending, top-ups and renewals by consolidation, release at shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tollgate_client::{Gateway, GatewayConfig, Spend, SpendError, Tally};

use crate::support::{Server, Storage, Tenant, assert_accounted, http_writer, writer_config};

#[tokio::test]
async fn a_gateway_spends_locally_renews_and_releases_with_exact_billing() {
    let server = Server::start(&Storage::Memory).await;
    let admin = server.admin();
    let tenants =
        [Tenant::create(&admin, "acct-gw-1", 10_000).await, Tenant::create(&admin, "acct-gw-2", 10_000).await];
    let (writer, losses) = http_writer(server.gateway(), writer_config(20));
    // The gateway's clock can be moved forward to make its leases due for
    // renewal; the server keeps real time, so the leases are still open there.
    let skew_s = Arc::new(AtomicI64::new(0));
    let clock_skew = skew_s.clone();
    let clock = Arc::new(move || Timestamp::now() + SignedDuration::from_secs(clock_skew.load(Ordering::Relaxed)));
    let config = GatewayConfig {
        lease_units: 100,
        lease_ttl: SignedDuration::from_mins(10),
        renew_margin: SignedDuration::from_mins(1),
    };
    let gateway = Gateway::with_clock(server.gateway(), writer.clone(), config, clock).unwrap();

    let mut spent = [0u64; 2];
    let mut leases_seen = std::collections::BTreeSet::new();
    for n in 0..300u64 {
        let which = (n % 2) as usize;
        let units = n % 7;
        let receipt = gateway
            .spend(Spend {
                dimensions: Default::default(),
                account_id: tenants[which].account_id.clone(),
                credential_id: tenants[which].credential_id.clone(),
                request_id: format!("gw-{n}"),
                units,
            })
            .await
            .unwrap();
        spent[which] += units;
        leases_seen.insert(receipt.lease_id);
        if n == 150 {
            // Nine and a half minutes on, both leases are within the margin.
            skew_s.store(570, Ordering::Relaxed);
            let renewals = gateway.renew_due().await;
            assert_eq!((renewals.renewed, renewals.failed.len()), (2, 0), "{renewals:?}");
            skew_s.store(0, Ordering::Relaxed);
        }
    }
    // 450 units per account in leases of 100: topped up several times, and
    // renewed once, each by consolidation into a new lease.
    assert!(leases_seen.len() > 6, "{leases_seen:?}");

    let report = gateway.shutdown(Duration::from_secs(60)).await.unwrap();
    assert_accounted(&report.writer);
    assert_eq!(report.writer.accepted, report.writer.recorded);
    assert_eq!(report.writer.accepted, Tally { events: 300, units: u128::from(spent[0] + spent[1]) });
    assert!(losses.lock().unwrap().is_empty());
    assert_eq!(report.released.len(), 2, "{:#?}", report.unreleased);
    assert!(report.unreleased.is_empty());

    for (tenant, spent) in tenants.iter().zip(spent) {
        let account = admin.account(&tenant.account_id).await.unwrap();
        // Every unit was spent within a grant: charged, never overage, and
        // everything not spent is back in `available`.
        assert_eq!((account.billed, account.consumed, account.overage), (spent, spent, 0), "{account:#?}");
        assert_eq!((account.reserved, account.active_leases), (0, 0));
        assert_eq!(account.available, 10_000 - spent);
    }
    let check = admin.check().await.unwrap();
    assert!(check.ok, "{check:#?}");
    let billed: u128 = {
        let mut total = 0;
        for tenant in &tenants {
            total += u128::from(admin.account(&tenant.account_id).await.unwrap().billed);
        }
        total
    };
    assert_eq!(billed, report.writer.delivered_units());

    // After shutdown the gateway takes no more spends.
    let closed = gateway
        .spend(Spend {
            dimensions: Default::default(),
            account_id: tenants[0].account_id.clone(),
            credential_id: tenants[0].credential_id.clone(),
            request_id: "late".into(),
            units: 1,
        })
        .await;
    assert_eq!(closed, Err(SpendError::Closed));
}

#[tokio::test]
async fn a_spend_beyond_the_balance_is_refused_and_nothing_is_recorded() {
    let server = Server::start(&Storage::Memory).await;
    let admin = server.admin();
    let tenant = Tenant::create(&admin, "acct-gw-poor", 50).await;
    let (writer, _) = http_writer(server.gateway(), writer_config(20));
    let config = GatewayConfig { lease_units: 40, ..GatewayConfig::default() };
    let gateway = Gateway::new(server.gateway(), writer.clone(), config).unwrap();
    let spend = |request_id: &str, units| Spend {
        dimensions: Default::default(),
        account_id: tenant.account_id.clone(),
        credential_id: tenant.credential_id.clone(),
        request_id: request_id.to_owned(),
        units,
    };

    assert_eq!(gateway.spend(spend("a", 30)).await.unwrap().remaining, 10);
    // 20 more needs a top-up of 40, but only 10 are available.
    let refused = gateway.spend(spend("b", 20)).await.unwrap_err();
    let SpendError::Lease { error, .. } = &refused else { panic!("{refused:?}") };
    assert_eq!((error.status, error.code.as_str()), (Some(409), "insufficient_balance"));
    assert_eq!(gateway.spend(spend("c", 5)).await.unwrap().remaining, 5, "the old lease is still held");

    let report = gateway.shutdown(Duration::from_secs(30)).await.unwrap();
    assert_accounted(&report.writer);
    assert_eq!(report.writer.recorded, Tally { events: 2, units: 35 });
    let account = admin.account(&tenant.account_id).await.unwrap();
    assert_eq!((account.billed, account.available, account.reserved), (35, 15, 0));
}

/// The server grants two minutes where ten were asked for, less than twice
/// the five-minute renew margin. The gateway renews such a lease half way
/// through its TTL instead of at once, so one lease serves many spends.
#[tokio::test]
async fn a_lease_shorter_than_the_renew_margin_is_not_renewed_on_every_spend() {
    let server = crate::support::Server::start_with(&Storage::Memory, "127.0.0.1:0", "PT2M").await;
    let admin = server.admin();
    let tenant = Tenant::create(&admin, "acct-short-ttl", 1_000).await;
    let (writer, _) = http_writer(server.gateway(), writer_config(20));
    let config = GatewayConfig {
        lease_units: 100,
        lease_ttl: SignedDuration::from_mins(10),
        renew_margin: SignedDuration::from_mins(5),
    };
    let gateway = Gateway::new(server.gateway(), writer, config).unwrap();
    let mut leases = std::collections::BTreeSet::new();
    for n in 0..20 {
        let spend = Spend {
            dimensions: Default::default(),
            account_id: tenant.account_id.clone(),
            credential_id: tenant.credential_id.clone(),
            request_id: format!("short-{n}"),
            units: 1,
        };
        leases.insert(gateway.spend(spend).await.unwrap().lease_id);
    }
    assert_eq!(leases.len(), 1, "{leases:?}");
    let report = gateway.shutdown(Duration::from_secs(30)).await.unwrap();
    assert_accounted(&report.writer);
    let account = admin.account(&tenant.account_id).await.unwrap();
    assert_eq!((account.billed, account.active_leases), (20, 0));
}

/// Spends for accounts that do not exist (or hold nothing) leave no slot
/// behind: the map holds only accounts with a lease.
#[tokio::test]
async fn slots_of_accounts_without_a_lease_are_forgotten() {
    let server = Server::start(&Storage::Memory).await;
    let tenant = Tenant::create(&server.admin(), "acct-slots", 1_000).await;
    let (writer, _) = http_writer(server.gateway(), writer_config(20));
    let gateway =
        Gateway::new(server.gateway(), writer, GatewayConfig { lease_units: 10, ..GatewayConfig::default() }).unwrap();
    for n in 0..50 {
        let spend = Spend {
            dimensions: Default::default(),
            account_id: format!("acct-missing-{n}"),
            credential_id: tenant.credential_id.clone(),
            request_id: format!("missing-{n}"),
            units: 1,
        };
        let refused = gateway.spend(spend).await.unwrap_err();
        let SpendError::Lease { error, .. } = &refused else { panic!("{refused:?}") };
        assert_eq!(error.status, Some(404), "{error}");
    }
    assert_eq!(gateway.accounts_tracked(), 0);
    let spend = Spend {
        dimensions: Default::default(),
        account_id: tenant.account_id.clone(),
        credential_id: tenant.credential_id.clone(),
        request_id: "held".into(),
        units: 1,
    };
    gateway.spend(spend).await.unwrap();
    assert_eq!(gateway.accounts_tracked(), 1);
    let report = gateway.shutdown(Duration::from_secs(30)).await.unwrap();
    assert_eq!(report.released.len(), 1);
}
