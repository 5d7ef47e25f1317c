//! The binary on PostgreSQL: the walk on a fresh database, several servers
//! sharing one reclaim grace, and `migrate` and `check` around an upgrade.
//! Each test gets its own database; without `DATABASE_URL` they fail and say
//! how to get one.

use serde_json::Value;
use tollgate_pg::testing::TestDb;

use crate::support::{Server, run};
use crate::walk::{self, Backend, SERVE_ARGS};

#[tokio::test]
async fn walk_on_postgres() {
    let db = TestDb::create().await;
    let server = Server::start(&SERVE_ARGS, &[("DATABASE_URL", db.url())]).await;
    assert!(
        server.banner.iter().any(|l| l.starts_with("store: postgres") && l.contains(db.name())),
        "{:?}",
        server.banner
    );
    assert!(!server.banner.iter().any(|l| l.contains(db.url())), "the URL may hold a password: {:?}", server.banner);
    walk::walk(&server, Backend { name: "postgres", units_max: i64::MAX as u64 }).await;
    let (stopped, stderr) = server.terminate().await;
    assert!(stopped, "SIGTERM is a clean stop:\n{stderr}");

    // With the server stopped, the offline check passes on what it left.
    let (ok, stdout, stderr) = run(&["check"], &[("DATABASE_URL", db.url())]).await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("result:      OK"), "{stdout}");
    db.drop_now().await;
}

#[tokio::test]
async fn servers_on_one_database_share_one_reclaim_grace() {
    let db = TestDb::create().await;
    let url = [("DATABASE_URL", db.url())];
    let first = Server::start(&["--reclaim-grace", "PT1.5S"], &url).await;
    // Equal durations written differently are the same grace.
    let same = Server::start(&["--reclaim-grace", "PT1.500000000S"], &url).await;

    let refused = Server::try_start(&["--reclaim-grace", "PT2S"], &url).await;
    let Err((status, stderr)) = refused else { panic!("a second grace must be refused") };
    assert!(
        stderr.contains("reclaim grace mismatch") && stderr.contains("PT1.5S") && stderr.contains("PT2S"),
        "{status}: {stderr}"
    );
    assert!(stderr.contains("--replace-recorded-grace"), "{stderr}");

    // The explicit operator flag records the new grace; now the old one is refused.
    let replaced = Server::start(&["--reclaim-grace", "PT2S", "--replace-recorded-grace"], &url).await;
    let Err((_, stderr)) = Server::try_start(&["--reclaim-grace", "PT1.5S"], &url).await else {
        panic!("the replaced grace must now be the only one")
    };
    assert!(stderr.contains("reclaim grace mismatch"), "{stderr}");
    for server in [first, same, replaced] {
        let (stopped, stderr) = server.terminate().await;
        assert!(stopped, "{stderr}");
    }
    db.drop_now().await;
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("check --json prints JSON ({e}):\n{stdout}"))
}

#[tokio::test]
async fn migrate_and_check_around_an_upgrade() {
    let db = TestDb::create().await;
    let url = [("DATABASE_URL", db.url())];
    let known: Vec<i64> = tollgate_pg::MIGRATOR.iter().map(|m| m.version).collect();
    let latest = *known.last().unwrap();

    // Before any migration: reachable, nothing applied, everything pending.
    let (ok, stdout, _) = run(&["check", "--json"], &url).await;
    assert!(!ok, "an unmigrated database is not ready");
    let report = json(&stdout);
    assert_eq!(report["ok"], false);
    assert_eq!(report["storage"]["reachable"], true);
    assert_eq!(report["storage"]["migrations"]["applied"], serde_json::json!([]));
    assert_eq!(report["storage"]["migrations"]["pending"], serde_json::json!(known));

    // An older schema (all but the latest): only the latest pending; the seed
    // 003 guard inspection still runs and finds nothing.
    db.migrate_through(latest - 1).await.unwrap();
    let (ok, stdout, _) = run(&["check", "--json"], &url).await;
    assert!(!ok);
    let report = json(&stdout);
    assert_eq!(report["storage"]["migrations"]["pending"], serde_json::json!([latest]));
    assert_eq!(report["guard_violations"], serde_json::json!([]));
    assert_eq!(report["ledger"], Value::Null);
    let (ok, human, _) = run(&["check"], &url).await;
    assert!(!ok);
    assert!(human.contains("NOT CURRENT") && human.contains("tollgate migrate"), "{human}");

    // Migrate reports each version it applied, then that nothing is left.
    let (ok, stdout, stderr) = run(&["migrate"], &url).await;
    assert!(ok, "{stderr}");
    let applied: Vec<&str> = stdout.lines().filter(|l| l.starts_with("applied ")).collect();
    assert_eq!(applied.len(), 1, "{stdout}");
    assert!(applied[0].starts_with(&format!("applied {latest:04} ")) && applied[0].ends_with(" s"), "{stdout}");
    let (ok, stdout, _) = run(&["migrate"], &url).await;
    assert!(ok);
    assert!(stdout.starts_with("nothing to do"), "{stdout}");

    let (ok, stdout, stderr) = run(&["check", "--json"], &url).await;
    assert!(ok, "{stdout}\n{stderr}");
    let report = json(&stdout);
    assert_eq!(report["ok"], true);
    assert_eq!(report["storage"]["migrations"]["current"], true);
    assert_eq!(report["ledger"]["accounts_checked"], 0);

    // A stored row that a guard forbids is a violation: check exits nonzero
    // and names it. The guards themselves refuse such writes, so the row is
    // planted with its constraint lifted, as old history would hold it.
    sqlx::raw_sql(
        "ALTER TABLE tollgate_accounts DROP CONSTRAINT IF EXISTS tollgate_accounts_next_fence_positive;
         INSERT INTO tollgate_accounts (account_id, next_fence) VALUES ('bad-fence', 0);",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let (ok, stdout, _) = run(&["check", "--json"], &url).await;
    assert!(!ok, "{stdout}");
    let report = json(&stdout);
    assert_eq!(
        report["guard_violations"],
        serde_json::json!([{"table": "tollgate_accounts", "key": "bad-fence", "column": "next_fence", "value": 0}])
    );
    db.drop_now().await;
}

#[tokio::test]
async fn migrate_applies_every_version_in_order_on_an_empty_database() {
    let db = TestDb::create().await;
    let (ok, stdout, stderr) = run(&["migrate"], &[("DATABASE_URL", db.url())]).await;
    assert!(ok, "{stderr}");
    let applied: Vec<String> =
        stdout.lines().filter_map(|l| l.strip_prefix("applied ").map(|rest| rest[..4].to_owned())).collect();
    let known: Vec<String> = tollgate_pg::MIGRATOR.iter().map(|m| format!("{:04}", m.version)).collect();
    assert_eq!(applied, known, "{stdout}");
    db.drop_now().await;
}

#[tokio::test]
async fn check_reports_an_unreachable_database() {
    let url = [("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nowhere")];
    let (ok, stdout, _) = run(&["check", "--json"], &url).await;
    assert!(!ok);
    let report = json(&stdout);
    assert_eq!(report["storage"]["reachable"], false);
    let (ok, human, _) = run(&["check"], &url).await;
    assert!(!ok);
    assert!(human.contains("UNREACHABLE") && human.contains("127.0.0.1:1/nowhere"), "{human}");
}
