//! Faults against the real binary on PostgreSQL: clients that hang up
//! mid-request, and a request that times out while its row is locked. After
//! each, every acknowledged write is still there, no fence was issued twice,
//! and nothing that was not acknowledged took effect.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tollgate_pg::testing::TestDb;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::load::{self, Load, Tally, Targets};
use crate::support::{Api, As, GATEWAY, Server, with_tokens};

/// Sessions of the test database, other than the caller's, that are running
/// a statement or sit inside a transaction.
async fn busy_sessions(observer: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction', \
         'idle in transaction (aborted)')",
    )
    .fetch_one(observer)
    .await
    .expect("pg_stat_activity readable")
}

/// Waits, bounded, until no session of the server is busy.
async fn until_quiet(observer: &PgPool) {
    for _ in 0..1_000 {
        if busy_sessions(observer).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a session of the server stayed busy or inside a transaction");
}

/// Sends `body` to `path` and resets the connection `delay_us` later,
/// without reading the answer.
async fn hang_up(server: &Server, path: &str, body: &Value, delay_us: u64) {
    let address = server.base.trim_start_matches("http://");
    let body = serde_json::to_vec(body).expect("JSON");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {GATEWAY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("send head");
    stream.write_all(&body).await.expect("send body");
    // A thread sleep: tokio's timer rounds up to whole milliseconds.
    std::thread::sleep(Duration::from_micros(delay_us));
    // Linger zero: closing sends RST, as a client that crashed would.
    stream.set_zero_linger().expect("SO_LINGER");
    drop(stream);
}

#[tokio::test]
async fn clients_hanging_up_lose_no_acknowledged_write() {
    let db = TestDb::create().await;
    let observer = db.new_pool(1).await;
    // One connection: every request meets whatever the last one left behind.
    let server = Server::start(&["--database-connections", "1"], &[("DATABASE_URL", db.url())]).await;
    let (credential_id, _key) = server.funded("p", 1000).await;

    // Usage batches whose clients hang up 0-2 ms after sending them, at
    // delays spread over that range so that some land mid-operation.
    let hang_ups = 200;
    for round in 0..hang_ups {
        let events: Vec<Value> = (0..50)
            .map(|i| {
                json!({"request_id": format!("h{round}-{i}"), "account_id": "p", "credential_id": credential_id,
                       "units": 1, "occurred_at": "2030-01-01T00:00:00Z"})
            })
            .collect();
        hang_up(&server, "/v1/usage", &json!({ "events": events }), (round * 397) % 2_000).await;
    }

    // Acknowledged leases...
    let mut fences = Vec::new();
    let mut leases = Vec::new();
    for _ in 0..3 {
        let lease = server.acquire("p", 100, "PT10M").await;
        fences.push(lease["fencing_token"].as_u64().expect("fence"));
        leases.push(lease["lease_id"].as_str().expect("lease id").to_owned());
    }
    // ...then a batch PostgreSQL refuses as a whole, which rolls back
    // whatever transaction its connection had open.
    let refused = server
        .call(
            As::Gateway,
            Method::POST,
            "/v1/usage",
            Some(json!({"events": [
                {"request_id": "big-1", "account_id": "p", "credential_id": credential_id,
                 "units": i64::MAX, "occurred_at": "2030-01-01T00:00:00Z"},
                {"request_id": "big-2", "account_id": "p", "credential_id": credential_id,
                 "units": i64::MAX, "occurred_at": "2030-01-01T00:00:00Z"}
            ]})),
        )
        .await;
    assert_eq!(refused.0, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.1);
    until_quiet(&observer).await;

    // Every acknowledged lease is still there, seen by another connection too.
    for lease_id in &leases {
        let lease = server
            .ok(As::Gateway, Method::GET, &format!("/v1/accounts/p/leases/{lease_id}"), None, StatusCode::OK)
            .await;
        assert_eq!(lease["state"], "active", "{lease}");
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM tollgate_leases WHERE account_id = 'p'")
        .fetch_one(&observer)
        .await
        .expect("lease rows readable");
    assert_eq!(stored, 3);
    // No fence twice: the next acquire gets the next one.
    let next = server.acquire("p", 1, "PT10M").await;
    fences.push(next["fencing_token"].as_u64().expect("fence"));
    assert_eq!(fences, [1, 2, 3, 4]);

    // Each hung-up batch was accepted whole or not at all: billed counts
    // whole batches of 50, and the stored events agree with it.
    let view = server.account("p").await;
    let billed = view["billed"].as_u64().expect("billed");
    assert_eq!(billed % 50, 0, "{view}");
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM tollgate_usage_events WHERE account_id = 'p'")
        .fetch_one(&observer)
        .await
        .expect("events readable");
    assert_eq!(u64::try_from(events).expect("count"), billed, "{view}");
    assert_eq!(view["reserved"], 301, "{view}");
    assert_eq!(view["available"], 699, "{view}");
    let check = server.check().await;
    assert_eq!(check["ok"], true, "{check}");

    shut_down([server], observer, db).await;
}

#[tokio::test]
async fn an_acquire_that_waited_past_its_deadline_grants_nothing() {
    let db = TestDb::create().await;
    let observer = db.new_pool(2).await;
    let server = Server::start(&["--request-timeout", "PT2S"], &[("DATABASE_URL", db.url())]).await;
    server.open_account("q", 1000).await;

    // Another session holds the account's row while the acquire runs.
    let mut holder = observer.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM tollgate_accounts WHERE account_id = 'q' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .expect("row locked");
    let (status, body) = server
        .call(As::Gateway, Method::POST, "/v1/accounts/q/leases", Some(json!({"units": 100, "ttl": "PT10M"})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");

    // Once the row is free, nothing of the refused acquire may take effect.
    holder.commit().await.expect("commit");
    until_quiet(&observer).await;
    let view = server.account("q").await;
    assert_eq!((&view["available"], &view["reserved"], &view["next_fence"]), (&json!(1000), &json!(0), &json!(1)));
    assert_eq!(view["active_leases"], 0, "{view}");

    shut_down([server], observer, db).await;
}

// ------------------------------------------------------------- under load

/// Clients, rounds and the hang-up rate of every load below: 2% of requests
/// are hung up.
const CLIENTS: usize = 6;
const ROUNDS: usize = 12;
const HANG_UP_EVERY: u64 = 50;

fn load(targets: Vec<String>) -> Load {
    Load {
        targets: Targets(Arc::new(targets)),
        clients: CLIENTS,
        rounds: ROUNDS,
        hang_up_every: HANG_UP_EVERY,
        tally: Arc::new(Tally::default()),
    }
}

/// Prints what happened to the requests, for the record of a run.
fn report(name: &str, load: &Load, extra: &str) {
    let t = &load.tally;
    eprintln!(
        "{name}: {} requests, {} answers lost, {} hung up{extra}",
        t.requests.load(Ordering::Relaxed),
        t.lost_answers.load(Ordering::Relaxed),
        t.hang_ups.load(Ordering::Relaxed)
    );
}

/// A free port on 127.0.0.1, for a server that must come back on the same
/// address after a restart.
fn free_listen_address() -> String {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    socket.local_addr().expect("address").to_string()
}

/// Ends a test's servers, each of which must stop cleanly on SIGTERM, then
/// its observer and its database.
async fn shut_down(servers: impl IntoIterator<Item = Server>, observer: PgPool, db: TestDb) {
    for server in servers {
        let (stopped, stderr) = server.terminate().await;
        assert!(stopped, "{stderr}");
    }
    observer.close().await;
    db.drop_now().await;
}

/// No fencing token of any account appears on two leases.
async fn assert_fences_unique(observer: &PgPool) {
    let repeated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT account_id, fencing_token FROM tollgate_leases \
         GROUP BY account_id, fencing_token HAVING count(*) > 1) AS twice",
    )
    .fetch_one(observer)
    .await
    .expect("leases readable");
    assert_eq!(repeated, 0, "a fencing token was issued twice");
}

#[tokio::test]
async fn load_with_hang_ups_on_the_memory_store() {
    let server = Server::start(&[], &[]).await;
    let accounts = load::accounts(&server.base, "m", CLIENTS, 1_000_000).await;
    let load = load(vec![server.base.clone()]);
    let seen = load.run(&accounts).await;
    load::verify(&server.base, &seen).await;
    report("memory store with hang-ups", &load, "");
    let (stopped, stderr) = server.terminate().await;
    assert!(stopped, "{stderr}");
}

#[tokio::test]
async fn two_servers_on_one_database_under_load_with_hang_ups() {
    let db = TestDb::create().await;
    let observer = db.new_pool(1).await;
    let env = [("DATABASE_URL", db.url())];
    let first = Server::start(&[], &env).await;
    let second = Server::start(&[], &env).await;
    let accounts = load::accounts(&first.base, "t", CLIENTS, 1_000_000).await;
    let load = load(vec![first.base.clone(), second.base.clone()]);
    let seen = load.run(&accounts).await;
    until_quiet(&observer).await;
    load::verify(&second.base, &seen).await;
    assert_fences_unique(&observer).await;
    report("two servers on PostgreSQL with hang-ups", &load, "");
    shut_down([first, second], observer, db).await;
}

#[tokio::test]
async fn a_server_killed_mid_load_and_restarted_loses_nothing() {
    let db = TestDb::create().await;
    let observer = db.new_pool(1).await;
    let env = [("DATABASE_URL", db.url())];
    let listen = free_listen_address();
    let server = Server::spawn_on(&listen, &[], &with_tokens(&env)).await.expect("server starts");
    let base = server.base.clone();
    let accounts = load::accounts(&base, "k", CLIENTS, 1_000_000).await;
    let load = load(vec![base.clone()]);

    // Kill the server with SIGKILL three times while the clients run, each
    // time once they have sent another 50 requests (a load sends about 220),
    // and start it again on the same address.
    let tally = Arc::clone(&load.tally);
    let url = db.url().to_owned();
    let done = Arc::new(AtomicBool::new(false));
    let finished = Arc::clone(&done);
    let killer = tokio::spawn(async move {
        let mut server = server;
        let mut kills = 0;
        while kills < 3 {
            let target = (kills + 1) * 50;
            while tally.requests.load(Ordering::Relaxed) < target {
                if finished.load(Ordering::Relaxed) {
                    panic!("the load finished after {kills} kills; kill sooner");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            server.kill().await;
            kills += 1;
            server =
                Server::spawn_on(&listen, &[], &with_tokens(&[("DATABASE_URL", &url)])).await.expect("server restarts");
        }
        server
    });
    let seen = load.run(&accounts).await;
    done.store(true, Ordering::Relaxed);
    let server = killer.await.expect("killer task");
    until_quiet(&observer).await;
    load::verify(&base, &seen).await;
    assert_fences_unique(&observer).await;
    report("server killed 3 times on PostgreSQL", &load, "");
    shut_down([server], observer, db).await;
}

#[tokio::test]
async fn database_connections_terminated_mid_load_lose_nothing() {
    let db = TestDb::create().await;
    let observer = db.new_pool(1).await;
    let server = Server::start(&[], &[("DATABASE_URL", db.url())]).await;
    let accounts = load::accounts(&server.base, "x", CLIENTS, 1_000_000).await;
    let load = load(vec![server.base.clone()]);

    // While the clients run, terminate one of the server's PostgreSQL
    // sessions every few milliseconds, whatever it is doing.
    let done = Arc::new(AtomicBool::new(false));
    let terminated = Arc::new(AtomicU64::new(0));
    let terminator = {
        let (observer, done, terminated) = (observer.clone(), Arc::clone(&done), Arc::clone(&terminated));
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let hit: Option<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                     ORDER BY random() LIMIT 1",
                )
                .fetch_optional(&observer)
                .await
                .expect("terminate");
                if hit == Some(true) {
                    terminated.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    let seen = load.run(&accounts).await;
    done.store(true, Ordering::Relaxed);
    terminator.await.expect("terminator task");
    let terminated = terminated.load(Ordering::Relaxed);
    assert!(terminated > 0, "no session was terminated");
    until_quiet(&observer).await;
    load::verify(&server.base, &seen).await;
    assert_fences_unique(&observer).await;
    report("PostgreSQL sessions terminated mid-load", &load, &format!(", {terminated} sessions terminated"));
    shut_down([server], observer, db).await;
}

/// A PostgreSQL cluster of this test's own, in a temporary directory, so
/// that restarting it disturbs no other test.
struct Cluster {
    dir: std::path::PathBuf,
    bin: std::path::PathBuf,
    port: u16,
}

impl Cluster {
    /// `program` of the cluster's binaries, run as `postgres` when this test
    /// runs as root: PostgreSQL refuses to run as root.
    fn command(&self, program: &str) -> std::process::Command {
        let program = self.bin.join(program);
        let as_root = std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if as_root {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            std::process::Command::new(&program)
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let mut command = self.command(program);
        let program = self.bin.join(program);
        let output = command.args(args).output().unwrap_or_else(|e| panic!("{}: {e}", program.display()));
        assert!(
            output.status.success(),
            "{} {args:?} failed:\n{}\n{}",
            program.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn pg_ctl(&self, action: &[&str]) {
        let data = self.dir.join("data");
        let options = format!("-p {} -k {} -c listen_addresses=127.0.0.1", self.port, self.dir.display());
        let log = self.dir.join("server.log");
        let mut args = vec!["-D", data.to_str().expect("path"), "-l", log.to_str().expect("path"), "-w", "-t", "60"];
        args.extend_from_slice(action);
        args.extend_from_slice(&["-o", &options]);
        self.run("pg_ctl", &args);
    }

    fn start() -> Cluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|versions| versions.flatten().map(|v| v.path().join("bin")).find(|b| b.join("initdb").exists()))
            .expect(
                "PostgreSQL's server binaries (initdb, pg_ctl) are not under /usr/lib/postgresql: \
                 install them with `apt-get install postgresql`, or run scripts/test, which does",
            );
        let dir = std::env::temp_dir().join(format!("tollgate-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let port = free_listen_address().rsplit(':').next().expect("port").parse().expect("port number");
        let cluster = Cluster { dir, bin, port };
        let _ = std::process::Command::new("chown").args(["-R", "postgres"]).arg(&cluster.dir).status();
        let data = cluster.dir.join("data");
        cluster.run(
            "initdb",
            &["-D", data.to_str().expect("path"), "--auth=trust", "-U", "postgres", "--no-sync", "-E", "UTF8"],
        );
        cluster.pg_ctl(&["start"]);
        cluster
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ =
            self.command("pg_ctl").args(["-D", data.to_str().unwrap_or_default(), "-m", "immediate", "stop"]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn postgres_restarted_mid_load_loses_nothing() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let observer = PgPool::connect(&url).await.expect("observer connects");
    let server = Server::start(&[], &[("DATABASE_URL", &url)]).await;
    let accounts = load::accounts(&server.base, "r", CLIENTS, 1_000_000).await;
    let load = load(vec![server.base.clone()]);

    // Restart PostgreSQL (fast shutdown: sessions are ended, open
    // transactions roll back) twice while the clients run.
    let tally = Arc::clone(&load.tally);
    let done = Arc::new(AtomicBool::new(false));
    let finished = Arc::clone(&done);
    let restarter = tokio::task::spawn_blocking(move || {
        for restarts in 0..2u64 {
            while tally.requests.load(Ordering::Relaxed) < (restarts + 1) * 60 {
                assert!(!finished.load(Ordering::Relaxed), "the load finished after {restarts} restarts");
                std::thread::sleep(Duration::from_millis(5));
            }
            cluster.pg_ctl(&["-m", "fast", "restart"]);
        }
        cluster
    });
    let seen = load.run(&accounts).await;
    done.store(true, Ordering::Relaxed);
    let cluster = restarter.await.expect("restarter");
    // The observer's connections died with the restarts; open new ones.
    observer.close().await;
    let observer = PgPool::connect(&url).await.expect("observer reconnects");
    until_quiet(&observer).await;
    load::verify(&server.base, &seen).await;
    assert_fences_unique(&observer).await;
    report("PostgreSQL restarted twice mid-load", &load, "");
    let (stopped, stderr) = server.terminate().await;
    assert!(stopped, "{stderr}");
    observer.close().await;
    drop(cluster);
}
