//! Every `/v1` route through the typed client, with its typed errors.

use jiff::SignedDuration;
use tollgate_api::LeaseHandleBody;
use tollgate_client::{ClientErrorKind, TollgateClient};
use tollgate_core::BATCH_EVENTS_MAX;

use crate::support::{ADMIN_TOKEN, GATEWAY_TOKEN, LEASE_TTL, Server, Storage, Tenant, client};

/// `(kind, status, code, retryable)` of a failed call.
fn failure<T: std::fmt::Debug>(
    result: Result<T, tollgate_client::ClientError>,
) -> (ClientErrorKind, Option<u16>, String, bool) {
    let error = result.expect_err("the call fails");
    (error.kind, error.status, error.code, error.retryable)
}

fn api(status: u16, code: &str) -> (ClientErrorKind, Option<u16>, String, bool) {
    (ClientErrorKind::Api, Some(status), code.to_owned(), false)
}

#[tokio::test]
async fn every_route_answers_with_its_typed_body_or_typed_error() {
    let server = Server::start(&Storage::Memory).await;
    let admin = server.admin();
    let gateway = server.gateway();

    // Operations routes.
    assert_eq!(admin.healthz().await.unwrap().status, "ok");
    let ready = gateway.readyz().await.unwrap();
    assert!(ready.ready);
    assert_eq!(ready.storage.backend, "memory");
    let openapi = admin.openapi().await.unwrap();
    for path in ["/v1/usage", "/v1/accounts/{account_id}/leases/consolidate", "/v1/admin/check"] {
        assert!(openapi["paths"].get(path).is_some(), "{path} is documented");
    }

    // Authentication and roles.
    assert_eq!(failure(client(&server.url(), None).account("a").await), api(401, "unauthorized"));
    assert_eq!(
        failure(client(&server.url(), Some("not-a-token-of-this-server")).account("a").await),
        api(401, "unauthorized")
    );
    assert_eq!(failure(gateway.create_account("by-gateway").await), api(403, "forbidden"));

    // Accounts and credits.
    let account = admin.create_account("acct-routes").await.unwrap();
    assert_eq!((account.account_id.as_str(), account.credited, account.next_fence), ("acct-routes", 0, 1));
    assert_eq!(failure(admin.create_account("acct-routes").await), api(409, "account_exists"));
    assert_eq!(failure(admin.create_account("no spaces").await), api(400, "invalid_id"));
    assert_eq!(failure(gateway.account("nobody").await), api(404, "account_not_found"));
    let credited = admin.credit("acct-routes", "credit-1", 100).await.unwrap();
    assert!(credited.created);
    assert_eq!((credited.account.credited, credited.account.available), (100, 100));
    let replayed = admin.credit("acct-routes", "credit-1", 100).await.unwrap();
    assert!(!replayed.created, "an identical replay answers 200");
    assert_eq!(replayed.account, credited.account);
    assert_eq!(failure(admin.credit("acct-routes", "credit-1", 99).await), api(409, "credit_conflict"));
    assert_eq!(failure(admin.credit("acct-routes", "credit-2", 0).await), api(400, "invalid_units"));

    // Credentials.
    let issued = admin.issue_credential("acct-routes", "edge").await.unwrap();
    assert!(!issued.key.is_empty());
    assert_eq!((issued.credential.label.as_str(), issued.credential.activity.accepted_events), ("edge", 0));
    let credential_id = issued.credential.credential_id.clone();
    assert_eq!(admin.credential("acct-routes", &credential_id).await.unwrap(), issued.credential);
    assert_eq!(failure(gateway.credential("acct-routes", &credential_id).await), api(403, "forbidden"));
    assert_eq!(failure(admin.credential("nobody", &credential_id).await), api(404, "credential_not_found"));
    let verified = gateway.verify_credential(&issued.key).await.unwrap();
    assert!(verified.valid);
    assert_eq!(verified.credential_id.as_deref(), Some(credential_id.as_str()));
    assert_eq!(verified.account_id.as_deref(), Some("acct-routes"));
    let unknown = gateway.verify_credential("tgc_not_a_key").await.unwrap();
    assert_eq!((unknown.valid, unknown.reason.as_deref()), (false, Some("unknown_credential")));

    // Leases.
    let lease = gateway.acquire("acct-routes", 40, SignedDuration::from_mins(10)).await.unwrap();
    let capability = lease.capability.clone().expect("acquire shows the capability");
    assert_eq!((lease.granted, lease.used, lease.fencing_token, lease.state.as_str()), (40, 0, 1, "active"));
    assert!(!lease.expiry_is_upper_bound);
    let read = gateway.lease(&lease.account_id, &lease.lease_id).await.unwrap();
    assert_eq!(read.capability, None, "reads never show the capability");
    assert_eq!(read, tollgate_api::LeaseBody { capability: None, ..lease.clone() });
    assert_eq!(failure(gateway.acquire("acct-routes", 1_000, LEASE_TTL).await), api(409, "insufficient_balance"));
    assert_eq!(failure(gateway.acquire("acct-routes", 0, LEASE_TTL).await), api(400, "invalid_units"));
    assert_eq!(failure(gateway.lease("acct-routes", "no-such-lease").await), api(404, "lease_not_found"));

    // Usage, in input order, with a duplicate inside the batch.
    let tenant = Tenant { account_id: "acct-routes".into(), credential_id: credential_id.clone() };
    let events = [
        tenant.leased("r1", 10, &lease.lease_id, lease.fencing_token),
        tenant.overage("r2", 5),
        tenant.leased("r1", 10, &lease.lease_id, lease.fencing_token),
        tenant.leased("r3", 1, &lease.lease_id, lease.fencing_token + 7),
    ];
    let ingested = gateway.send_usage(&events).await.unwrap();
    let outcomes: Vec<(&str, &str, Option<&str>)> =
        ingested.outcomes.iter().map(|o| (o.request_id.as_str(), o.outcome.as_str(), o.reason.as_deref())).collect();
    assert_eq!(
        outcomes,
        [
            ("r1", "accepted", None),
            ("r2", "accepted", None),
            ("r1", "duplicate", None),
            ("r3", "rejected", Some("fence_mismatch"))
        ]
    );

    // Consolidation carries the unused 30 units and adds 20.
    let handle = LeaseHandleBody { lease_id: lease.lease_id.clone(), capability: capability.clone() };
    let consolidated = gateway.consolidate("acct-routes", vec![handle.clone()], 20, LEASE_TTL).await.unwrap();
    assert_eq!((consolidated.lease.granted, consolidated.lease.fencing_token), (50, 2));
    let settlement = &consolidated.settlements[0];
    assert_eq!((settlement.charged, settlement.returned, settlement.excess), (10, 30, 0));
    assert_eq!(gateway.lease(&lease.account_id, &lease.lease_id).await.unwrap().state, "consolidated");
    assert_eq!(
        failure(gateway.consolidate("acct-routes", vec![handle], 0, LEASE_TTL).await),
        api(409, "lease_not_active")
    );

    // Release hands everything back.
    let new_lease = consolidated.lease;
    let new_capability = new_lease.capability.clone().unwrap();
    assert_eq!(
        failure(gateway.release(&new_lease.account_id, &new_lease.lease_id, "tgl_wrong").await),
        api(409, "capability_mismatch")
    );
    let released = gateway.release(&new_lease.account_id, &new_lease.lease_id, &new_capability).await.unwrap();
    assert_eq!((released.charged, released.returned, released.excess), (0, 50, 0));
    assert_eq!(released.lease.state, "released");
    assert_eq!(
        failure(gateway.release(&new_lease.account_id, &new_lease.lease_id, &new_capability).await),
        api(409, "lease_not_active")
    );
    assert_eq!(failure(gateway.release("acct-routes", "no-such-lease", "x").await), api(404, "lease_not_found"));

    // The ledger after all of it.
    let account = gateway.account("acct-routes").await.unwrap();
    assert_eq!(
        (account.credited, account.available, account.reserved, account.consumed, account.overage, account.billed),
        (100, 90, 0, 10, 5, 15)
    );
    assert_eq!((account.next_fence, account.active_leases), (3, 0));
    let activity = admin.credential("acct-routes", &credential_id).await.unwrap().activity;
    assert_eq!((activity.accepted_events, activity.accepted_units), (2, 15));

    // Revocation.
    assert_eq!(failure(admin.revoke_credential("nobody", &credential_id).await), api(404, "credential_not_found"));
    let revoked = admin.revoke_credential("acct-routes", &credential_id).await.unwrap();
    assert!(revoked.revoked_at.is_some());
    let verified = gateway.verify_credential(&issued.key).await.unwrap();
    assert_eq!((verified.valid, verified.reason.as_deref()), (false, Some("credential_revoked")));
    assert_eq!(
        failure(admin.revoke_credential("acct-routes", "no-such-credential").await),
        api(404, "credential_not_found")
    );

    // Admin routes.
    let reclaimed = admin.reclaim().await.unwrap();
    assert!(reclaimed.reclaimed.is_empty() && !reclaimed.full);
    assert_eq!(failure(gateway.reclaim().await), api(403, "forbidden"));
    let check = admin.check().await.unwrap();
    assert!(check.ok, "{check:#?}");
    assert_eq!(check.ledger.as_ref().map(|ledger| ledger.accounts_checked), Some(1));
    let metrics = admin.metrics().await.unwrap();
    assert!(metrics.contains("tollgate_"), "{metrics}");
}

#[tokio::test]
async fn usage_answers_carry_their_status_code_and_retryability() {
    let server = Server::start(&Storage::Memory).await;
    let tenant = Tenant::create(&server.admin(), "acct-sink", 10).await;
    let gateway = server.gateway();

    // 200: outcomes.
    let answer = gateway.send_usage(&[tenant.overage("ok", 1)]).await.unwrap();
    assert_eq!(answer.outcomes[0].outcome, "accepted");

    // 422: refused, naming the counter that would overflow; nothing applied.
    let overflow = [tenant.overage("big", u64::MAX), tenant.overage("one-more", 1)];
    let refused = gateway.send_usage(&overflow).await.unwrap_err();
    assert_eq!((refused.status, refused.code.as_str(), refused.retryable), (Some(422), "batch_refused", false));
    assert!(refused.message.contains("billed"), "{refused}");

    // 413: too many events for one batch.
    let too_many: Vec<_> = (0..=BATCH_EVENTS_MAX).map(|n| tenant.overage(&format!("e{n}"), 0)).collect();
    let too_large = gateway.send_usage(&too_many).await.unwrap_err();
    assert_eq!((too_large.status, too_large.code.as_str(), too_large.retryable), (Some(413), "batch_too_large", false));

    // 401: refused outright; a connection failure: retryable.
    let wrong_token = client(&server.url(), Some(ADMIN_TOKEN.replace("admin", "other").as_str()));
    assert_eq!(
        failure(wrong_token.send_usage(&[tenant.overage("x", 1)]).await),
        (ClientErrorKind::Api, Some(401), "unauthorized".to_owned(), false)
    );

    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let nowhere: TollgateClient = client(&format!("http://{closed_port}"), Some(GATEWAY_TOKEN));
    assert_eq!(
        failure(nowhere.send_usage(&[tenant.overage("x", 1)]).await),
        (ClientErrorKind::Connect, None, "connect_failed".to_owned(), true)
    );

    // Only the first event was billed.
    assert_eq!(server.admin().account("acct-sink").await.unwrap().billed, 1);
}
