//! The gateway and its writer run through the fault proxy, on both stores.
//! Every scenario ends with the same three checks: the units the gateway
//! served are the units the server billed, no lease is left active after
//! `shutdown`, and the writer accounted for every event it recorded.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tollgate_client::{ClientConfig, Gateway, GatewayConfig, LossReport, Spend, SpendError, TollgateClient};
use tollgate_pg::testing::TestDb;

use crate::faults::{Fault, FaultProxy, Rule, storage};
use crate::support::{GATEWAY_TOKEN, Server, Tenant, assert_accounted, http_writer, writer_config};

const CONSOLIDATE: &str = "/leases/consolidate";
/// Nine and a half minutes on, a ten-minute lease is within its one-minute
/// renew margin.
const SKEW_DUE_S: i64 = 570;

/// A server, the proxy in front of it, one funded account, and a gateway whose
/// client and writer both go through the proxy.
struct Rig {
    server: Server,
    proxy: FaultProxy,
    tenant: Tenant,
    gateway: Gateway,
    losses: Arc<Mutex<Vec<LossReport>>>,
    skew_s: Arc<AtomicI64>,
    served: u64,
    requests: u64,
    /// Other accounts the gateway served, and the units served to each.
    others: Vec<(String, u64)>,
    _db: Option<TestDb>,
}

impl Rig {
    async fn start(postgres: bool, account_id: &str, balance: u64, lease_units: u64) -> Rig {
        let (storage, db) = storage(postgres).await;
        let server = Server::start(&storage).await;
        let tenant = Tenant::create(&server.admin(), account_id, balance).await;
        let proxy = FaultProxy::start(server.address).await;
        // One attempt per call, so that every fault reaches the gateway
        // instead of being ridden out by the client's own keyed retries.
        let mut config = ClientConfig::new(proxy.url(), Some(GATEWAY_TOKEN));
        config.mutation_attempts_max = 1;
        let client = TollgateClient::new(config).expect("client");
        let (writer, losses) = http_writer(client.clone(), writer_config(20));
        let skew_s = Arc::new(AtomicI64::new(0));
        let clock_skew = skew_s.clone();
        let clock = Arc::new(move || Timestamp::now() + SignedDuration::from_secs(clock_skew.load(Ordering::Relaxed)));
        let config = GatewayConfig {
            lease_units,
            lease_ttl: SignedDuration::from_mins(10),
            renew_margin: SignedDuration::from_mins(1),
        };
        let gateway = Gateway::with_clock(client, writer, config, clock).expect("gateway");
        Rig { server, proxy, tenant, gateway, losses, skew_s, served: 0, requests: 0, others: Vec::new(), _db: db }
    }

    fn next_spend(&mut self, units: u64) -> Spend {
        self.requests += 1;
        Spend {
            dimensions: Default::default(),
            account_id: self.tenant.account_id.clone(),
            credential_id: self.tenant.credential_id.clone(),
            request_id: format!("req-{}", self.requests),
            units,
        }
    }

    /// Spends and counts the units as served when the gateway says so.
    async fn spend(&mut self, units: u64) -> Result<(), SpendError> {
        let spend = self.next_spend(units);
        self.gateway.spend(spend).await?;
        self.served += units;
        Ok(())
    }

    async fn spend_receipt(&mut self, units: u64) -> tollgate_client::SpendReceipt {
        let spend = self.next_spend(units);
        let receipt = self.gateway.spend(spend).await.expect("the spend is allowed");
        self.served += units;
        receipt
    }

    async fn spend_ok(&mut self, count: u64, units: u64) {
        for _ in 0..count {
            self.spend(units).await.expect("the spend is allowed");
        }
    }

    /// Shuts the gateway down and checks the three invariants.
    async fn finish(self) {
        let report = self.gateway.shutdown(Duration::from_secs(60)).await.expect("the writer ran to the end");
        assert_accounted(&report.writer);
        assert!(report.unreleased.is_empty(), "{:#?}", report.unreleased);
        let admin = self.server.admin();
        let account = admin.account(&self.tenant.account_id).await.unwrap();
        assert_eq!(account.billed, self.served, "served units are billed: {account:#?}\n{:#?}", report.writer);
        assert_eq!((account.active_leases, account.reserved), (0, 0), "no lease left active: {account:#?}");
        let mut billed = u128::from(account.billed);
        for (account_id, served) in &self.others {
            let account = admin.account(account_id).await.unwrap();
            assert_eq!(account.billed, *served, "served units are billed: {account:#?}");
            assert_eq!((account.active_leases, account.reserved), (0, 0), "no lease left active: {account:#?}");
            billed += u128::from(account.billed);
        }
        assert_eq!(billed, report.writer.delivered_units(), "{:#?}", report.writer);
        assert!(self.losses.lock().unwrap().is_empty(), "{:#?}", self.losses.lock().unwrap());
        let check = admin.check().await.unwrap();
        assert!(check.ok, "{check:#?}");
    }

    /// Waits (bounded) until the server no longer holds `lease_id` active:
    /// the consolidation sent through the proxy has been applied.
    async fn wait_settled(&self, lease_id: &str) {
        for _ in 0..600 {
            let lease = self.server.gateway().lease(&self.tenant.account_id, lease_id).await.unwrap();
            if lease.state != "active" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("lease {lease_id} was never settled");
    }
}

/// A renewal whose answer goes astray: the server may have consolidated the
/// old lease, so the gateway must not spend from it again before it knows.
async fn renewal_answer_lost(postgres: bool, fault: Fault) {
    let mut rig = Rig::start(postgres, "acct-renew-fault", 1_000, 30).await;
    rig.spend_ok(10, 1).await;
    rig.proxy.once("POST", CONSOLIDATE, 1, fault);
    rig.skew_s.store(SKEW_DUE_S, Ordering::Relaxed);
    let renewals = rig.gateway.renew_due().await;
    assert_eq!((renewals.renewed, renewals.failed.len()), (0, 1), "{renewals:?}");
    rig.skew_s.store(0, Ordering::Relaxed);
    assert_eq!(rig.proxy.faults().len(), 1);
    // Asked again under its key, the consolidation is answered (replayed if it
    // was applied, applied now if it never arrived) and spending goes on from
    // the new lease.
    rig.spend_ok(20, 1).await;
    rig.finish().await;
}

/// The caller gives up on a spend whose renewal answer is late: the future is
/// dropped while the server has already consolidated.
async fn renewal_abandoned(postgres: bool) {
    let mut rig = Rig::start(postgres, "acct-renew-drop", 1_000, 30).await;
    rig.spend_ok(10, 1).await;
    let held = rig.spend_receipt(1).await.lease_id;
    rig.proxy.once("POST", CONSOLIDATE, 1, Fault::DelayAnswer(Duration::from_secs(3)));
    rig.skew_s.store(SKEW_DUE_S, Ordering::Relaxed);
    let spend = rig.next_spend(1);
    // The caller drops the spend once its consolidation has reached the proxy
    // (as `tokio::time::timeout` or an aborted task would).
    tokio::select! {
        answer = rig.gateway.spend(spend) => panic!("the answer was held back: {answer:?}"),
        () = async {
            while rig.proxy.faults().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } => {}
    }
    rig.skew_s.store(0, Ordering::Relaxed);
    rig.wait_settled(&held).await;
    rig.spend_ok(20, 1).await;
    rig.finish().await;
}

/// An acquire whose answer is lost: asked again under its key, the same lease
/// comes back instead of a second one being granted.
async fn acquire_answer_lost(postgres: bool, fault: Fault) {
    let mut rig = Rig::start(postgres, "acct-acquire-fault", 100, 100).await;
    rig.proxy.once("POST", "/leases", 1, fault);
    let failed = rig.spend(1).await;
    assert!(matches!(failed, Err(SpendError::Lease { .. })), "{failed:?}");
    rig.spend_ok(5, 1).await;
    let account = rig.server.admin().account(&rig.tenant.account_id).await.unwrap();
    assert_eq!(account.active_leases, 1, "one lease granted: {account:#?}");
    rig.finish().await;
}

/// `shutdown` while a spend waits for a consolidation answer held back far
/// longer than the shutdown's deadline: the spend is cut off, and shutdown
/// settles the consolidation itself (asking again under its key) and
/// releases the lease it granted, within its deadline.
async fn shutdown_during_a_late_consolidation(postgres: bool) {
    let mut rig = Rig::start(postgres, "acct-shutdown-late", 1_000, 30).await;
    rig.spend_ok(30, 1).await;
    rig.proxy.once("POST", CONSOLIDATE, 1, Fault::DelayAnswer(Duration::from_secs(120)));
    let spend = rig.next_spend(1);
    let (spent, report) = tokio::join!(rig.gateway.spend(spend), async {
        while rig.proxy.faults().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        rig.gateway.shutdown(Duration::from_secs(10)).await.expect("the writer ran to the end")
    });
    assert_eq!(spent, Err(SpendError::Closed));
    assert!(report.unreleased.is_empty(), "{:#?}", report.unreleased);
    assert_eq!(report.released.len(), 1, "the consolidated lease: {:#?}", report.released);
    assert_accounted(&report.writer);
    let account = rig.server.admin().account(&rig.tenant.account_id).await.unwrap();
    assert_eq!((account.billed, account.active_leases, account.reserved), (rig.served, 0, 0), "{account:#?}");
}

/// Two accounts due for renewal, the first consolidation's answer lost:
/// `renew_due` reports that account and renews the other regardless.
async fn renewal_with_one_failing_account(postgres: bool) {
    let mut rig = Rig::start(postgres, "acct-renew-a", 1_000, 30).await;
    let other = Tenant::create(&rig.server.admin(), "acct-renew-b", 1_000).await;
    rig.spend_ok(5, 1).await;
    let other_spend = |n: u64| Spend {
        dimensions: Default::default(),
        account_id: other.account_id.clone(),
        credential_id: other.credential_id.clone(),
        request_id: format!("other-{n}"),
        units: 1,
    };
    rig.gateway.spend(other_spend(0)).await.unwrap();
    rig.proxy.once("POST", CONSOLIDATE, 1, Fault::DropAnswer);
    rig.skew_s.store(SKEW_DUE_S, Ordering::Relaxed);
    let renewals = rig.gateway.renew_due().await;
    rig.skew_s.store(0, Ordering::Relaxed);
    assert_eq!((renewals.renewed, renewals.failed.len()), (1, 1), "{renewals:?}");
    rig.spend_ok(5, 1).await;
    rig.gateway.spend(other_spend(1)).await.unwrap();
    rig.others.push((other.account_id.clone(), 2));
    rig.finish().await;
}

/// Usage answers go astray in every way the proxy knows while the gateway
/// spends: the writer retries each batch under the same request ids, the
/// server answers the applied ones `duplicate`, and every unit is billed once.
async fn usage_answers_lost(postgres: bool) {
    let mut rig = Rig::start(postgres, "acct-usage-faults", 1_000, 50).await;
    for (nth, fault) in [
        (1, Fault::DropAnswer),
        (2, Fault::TruncateAnswer),
        (3, Fault::Reset),
        (4, Fault::DelayAnswer(Duration::from_millis(200))),
    ] {
        rig.proxy.once("POST", "/v1/usage", nth, fault);
    }
    for _ in 0..8 {
        rig.spend_ok(10, 1).await;
        rig.gateway.writer().flush().await.unwrap();
    }
    assert_eq!(rig.proxy.faults().len(), 4, "{:?}", rig.proxy.faults());
    let stats = rig.gateway.writer().stats();
    assert!(stats.redelivered.events > 0, "the applied batches came back duplicate: {stats:#?}");
    rig.finish().await;
}

/// A top-up of one account while another account's usage answer is held
/// back: the top-up delivers only the usage recorded against its own lease
/// and goes ahead, instead of waiting for the whole writer.
async fn top_up_while_another_accounts_usage_is_held(postgres: bool) {
    let mut rig = Rig::start(postgres, "acct-topup-a", 1_000, 10).await;
    let other = Tenant::create(&rig.server.admin(), "acct-topup-b", 1_000).await;
    rig.spend_ok(3, 1).await;
    rig.gateway.writer().flush().await.unwrap();
    // Every usage request from now on, the writer's retries included, is
    // applied but not answered until released.
    rig.proxy.add(Rule { method: "POST", path: "/v1/usage", nth: 1, count: 1_000, fault: Fault::HoldAnswer });
    let other_spend = Spend {
        dimensions: Default::default(),
        account_id: other.account_id.clone(),
        credential_id: other.credential_id.clone(),
        request_id: "other-1".into(),
        units: 1,
    };
    rig.gateway.spend(other_spend).await.unwrap();
    rig.others.push((other.account_id.clone(), 1));
    // Its batch goes out once it is 50 ms old; wait (bounded) until it is sent.
    for _ in 0..600 {
        if rig.gateway.writer().stats().in_flight.events == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Seven units are left on the lease; ten need a consolidation. Waiting
    // for the held batch would never end, so the guard below only bounds a
    // failure.
    let top_up = tokio::time::timeout(Duration::from_secs(120), rig.spend(10)).await;
    assert!(matches!(top_up, Ok(Ok(()))), "the top-up went ahead: {top_up:?}");
    let stats = rig.gateway.writer().stats();
    assert_eq!(stats.in_flight.events, 1, "the other account's event is still held: {stats:#?}");

    rig.proxy.release_held();
    rig.finish().await;
}

macro_rules! on_both_stores {
    ($($name:ident => $scenario:expr;)*) => {
        mod memory {
            use super::*;
            $(#[tokio::test] async fn $name() { let postgres = false; ($scenario)(postgres).await })*
        }
        mod postgres {
            use super::*;
            $(#[tokio::test] async fn $name() { let postgres = true; ($scenario)(postgres).await })*
        }
    };
}

on_both_stores! {
    renewal_answer_dropped => |pg| renewal_answer_lost(pg, Fault::DropAnswer);
    renewal_answer_truncated => |pg| renewal_answer_lost(pg, Fault::TruncateAnswer);
    renewal_connection_reset => |pg| renewal_answer_lost(pg, Fault::Reset);
    renewal_abandoned_while_its_answer_is_late => renewal_abandoned;
    acquire_answer_dropped => |pg| acquire_answer_lost(pg, Fault::DropAnswer);
    acquire_connection_reset => |pg| acquire_answer_lost(pg, Fault::Reset);
    shutdown_cuts_off_a_spend_and_settles_its_consolidation => shutdown_during_a_late_consolidation;
    renew_due_goes_on_past_a_failing_account => renewal_with_one_failing_account;
    usage_answers_dropped_truncated_reset_and_delayed => usage_answers_lost;
    a_top_up_does_not_wait_for_other_accounts_usage => top_up_while_another_accounts_usage_is_held;
}
