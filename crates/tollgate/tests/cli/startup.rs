//! Invalid configuration fails at startup with a message naming the setting.

use crate::support::run;

/// Arguments, environment, and what stderr must name.
type StartupCase = (Vec<&'static str>, Vec<(&'static str, &'static str)>, &'static str);

#[tokio::test]
async fn invalid_configuration_names_the_setting() {
    let token = ("TOLLGATE_ADMIN_TOKEN", "admin-token-for-end-to-end-tests");
    let cases: Vec<StartupCase> = vec![
        (vec!["serve", "--max-ttl", "PT0S"], vec![], "TOLLGATE_MAX_TTL"),
        (vec!["serve", "--max-ttl", "ten minutes"], vec![], "--max-ttl"),
        (vec!["serve"], vec![("TOLLGATE_RECLAIM_GRACE", "-PT1S")], "TOLLGATE_RECLAIM_GRACE"),
        (vec!["serve"], vec![("TOLLGATE_RECLAIM_GRACE", "30")], "--reclaim-grace"),
        (vec!["serve", "--reclaim-batch", "0"], vec![], "TOLLGATE_RECLAIM_BATCH"),
        (vec!["serve", "--reclaim-batch", "100001"], vec![], "TOLLGATE_RECLAIM_BATCH"),
        (vec!["serve", "--reclaim-interval", "PT0S"], vec![], "TOLLGATE_RECLAIM_INTERVAL"),
        (vec!["serve", "--request-timeout=-PT1S"], vec![], "TOLLGATE_REQUEST_TIMEOUT"),
        (vec!["serve", "--idempotency-retention", "PT0S"], vec![], "TOLLGATE_IDEMPOTENCY_RETENTION"),
        (vec!["serve"], vec![("TOLLGATE_IDEMPOTENCY_RETENTION", "1 day")], "--idempotency-retention"),
        (vec!["serve", "--header-timeout", "PT0S"], vec![], "TOLLGATE_HEADER_TIMEOUT"),
        (vec!["serve"], vec![("TOLLGATE_IDLE_TIMEOUT", "-PT1S")], "TOLLGATE_IDLE_TIMEOUT"),
        (vec!["serve", "--max-connections", "0"], vec![], "--max-connections"),
        (vec!["serve", "--listen", "nowhere"], vec![], "--listen"),
        (vec!["serve", "--admin-token", "short"], vec![], "admin token"),
        (vec!["serve"], vec![token, ("TOLLGATE_GATEWAY_TOKEN", "admin-token-for-end-to-end-tests")], "must differ"),
        (vec!["serve"], vec![("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")], "TOLLGATE_ADMIN_TOKEN"),
        (vec!["serve"], vec![token, ("DATABASE_URL", "not a url")], "DATABASE_URL"),
        (vec!["serve"], vec![token, ("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")], "DATABASE_URL"),
        (vec!["migrate"], vec![], "DATABASE_URL"),
        (vec!["check"], vec![], "DATABASE_URL"),
    ];
    for (args, env, setting) in cases {
        let (ok, stdout, stderr) = run(&args, &env).await;
        assert!(!ok, "{args:?} {env:?} must fail; stdout:\n{stdout}");
        assert!(stderr.contains(setting), "{args:?} {env:?}: stderr must name {setting}:\n{stderr}");
        assert!(!stdout.contains("listening on"), "{args:?} {env:?} must not listen");
    }
}

#[tokio::test]
async fn a_port_in_use_is_a_startup_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let (ok, _, stderr) = run(&["serve", "--listen", &address], &[]).await;
    assert!(!ok);
    assert!(stderr.contains("--listen / TOLLGATE_LISTEN"), "{stderr}");
}
