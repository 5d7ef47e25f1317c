//! The connection flags reach the real server: the open-connection cap, the
//! idle and header timeouts, and the cap lowered to fit the open-file limit.
//! Each case sets one bound short and leaves the others long, so a closed
//! connection can only be the bound under test; waits are bounded polls.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tollgate_testkit::healthz;

use crate::support::{ADMIN, GATEWAY, PROCESS_WAIT_MAX, Server, tollgate};

/// Waits until the server closes `stream`; returns what it sent first.
async fn closed_by_server(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    match tokio::time::timeout(PROCESS_WAIT_MAX, stream.read_to_end(&mut received)).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}"),
        Err(_) => panic!("the server did not close the connection"),
    }
    received
}

fn address(base: &str) -> String {
    base.strip_prefix("http://").expect("an http base").to_owned()
}

#[tokio::test]
async fn the_cap_and_the_idle_timeout_are_flags() {
    let server = Server::start(&["--max-connections", "1"], &[("TOLLGATE_IDLE_TIMEOUT", "PT0.3S")]).await;
    assert!(
        server.banner.iter().any(|line| line.starts_with("connections: at most 1 open; header timeout PT10S")),
        "{:?}",
        server.banner
    );
    let address = address(&server.base);
    let mut first = TcpStream::connect(&address).await.unwrap();
    assert_eq!(healthz(&mut first).await.unwrap(), "HTTP/1.1 200 OK");
    let mut second = TcpStream::connect(&address).await.unwrap();
    assert!(closed_by_server(&mut second).await.is_empty(), "beyond the cap: closed before anything is read");
    assert!(closed_by_server(&mut first).await.is_empty(), "idle past the idle timeout: closed");
    let (stopped, stderr) = server.terminate().await;
    assert!(stopped, "{stderr}");
}

#[tokio::test]
async fn the_header_timeout_is_a_flag() {
    let server = Server::start(&["--header-timeout", "PT0.3S"], &[]).await;
    let mut slow = TcpStream::connect(address(&server.base)).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ").await.unwrap();
    assert!(closed_by_server(&mut slow).await.is_empty(), "an unfinished head gets no answer");
    let (stopped, stderr) = server.terminate().await;
    assert!(stopped, "{stderr}");
}

/// Under an open-file limit of 128 the default cap of 512 cannot hold, so the
/// server lowers it to 128 - 32 reserved = 96 and says so. Then 96 idle
/// connections fill it, the next one is closed, and an open one is still
/// served: the server never runs out of descriptors.
#[tokio::test]
async fn the_cap_is_lowered_to_fit_the_open_file_limit() {
    // bash lowers the limit and execs the binary, with the environment
    // `tollgate()` would give it.
    let command = tollgate();
    let binary = command.as_std().get_program().to_owned();
    let mut child = command
        .as_std()
        .get_envs()
        .fold(tokio::process::Command::new("bash"), |mut bash, (name, value)| {
            match value {
                Some(value) => bash.env(name, value),
                None => bash.env_remove(name),
            };
            bash
        })
        .args(["-c", r#"ulimit -n 128 && exec "$@""#, "bash"])
        .arg(binary)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .envs([("TOLLGATE_ADMIN_TOKEN", ADMIN), ("TOLLGATE_GATEWAY_TOKEN", GATEWAY)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("bash starts the binary");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let mut banner = Vec::new();
    let base = tokio::time::timeout(PROCESS_WAIT_MAX, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(base) = line.strip_prefix("listening on ") {
                return base.to_owned();
            }
            banner.push(line);
        }
        panic!("the server exited before listening: {banner:?}");
    })
    .await
    .expect("the server starts");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    assert!(
        banner.iter().any(|line| line.starts_with(
            "connections: at most 96 open, lowered from 512 (--max-connections / TOLLGATE_MAX_CONNECTIONS) \
             to fit the open-file limit 128"
        )),
        "{banner:?}"
    );

    let address = address(&base);
    let mut open = Vec::new();
    for _ in 0..96 {
        let mut stream = TcpStream::connect(&address).await.unwrap();
        assert_eq!(healthz(&mut stream).await.unwrap(), "HTTP/1.1 200 OK");
        open.push(stream);
    }
    let mut beyond = TcpStream::connect(&address).await.unwrap();
    assert!(closed_by_server(&mut beyond).await.is_empty());
    assert_eq!(healthz(&mut open[0]).await.unwrap(), "HTTP/1.1 200 OK");
    drop(open);
    child.kill().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}
