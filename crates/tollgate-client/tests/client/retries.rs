//! Lost answers: the typed client retries a mutating call under the key it
//! first sent, so the server answers again instead of applying it twice.
//!
//! A proxy in front of the real server forwards each request and then, for
//! the first `lose` connections, drops the connection as soon as the server's
//! answer begins: the server has applied the request, the client never hears.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_client::{ClientConfig, ClientErrorKind, TollgateClient};

use crate::faults::read_message;
use crate::support::{ADMIN_TOKEN, GATEWAY_TOKEN, LEASE_TTL, Server, Storage, Tenant};

struct LosingProxy {
    address: SocketAddr,
    connections: Arc<AtomicU32>,
}

impl LosingProxy {
    async fn start(upstream: SocketAddr, lose: u32) -> LosingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let address = listener.local_addr().expect("proxy address");
        let connections = Arc::new(AtomicU32::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let number = counted.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(async move {
                    let server = TcpStream::connect(upstream).await.expect("upstream reachable");
                    if number <= lose {
                        lose_answer(client, server).await;
                    } else {
                        let (mut client, mut server) = (client, server);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        LosingProxy { address, connections }
    }

    fn client(&self, attempts_max: u32) -> TollgateClient {
        let mut config = ClientConfig::new(format!("http://{}", self.address), Some(GATEWAY_TOKEN));
        config.mutation_attempts_max = attempts_max;
        config.mutation_backoff_initial = Duration::from_millis(10);
        TollgateClient::new(config).expect("client")
    }

    fn connections(&self) -> u32 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Forwards one whole request, waits for the first byte of the answer, and
/// closes both connections.
async fn lose_answer(mut client: TcpStream, mut server: TcpStream) {
    let request = read_message(&mut client).await.expect("a whole request");
    server.write_all(&request).await.expect("forward the request");
    let mut first = [0u8; 1];
    server.read_exact(&mut first).await.expect("the server answers");
}

#[tokio::test]
async fn a_lost_answer_is_retried_under_its_key_and_applies_once() {
    let server = Server::start(&Storage::Memory).await;
    let admin = crate::support::client(&server.url(), Some(ADMIN_TOKEN));
    Tenant::create(&admin, "acct-retry", 100).await;

    let proxy = LosingProxy::start(server.address, 1).await;
    let lease = proxy.client(4).acquire("acct-retry", 10, LEASE_TTL).await.expect("the retry answers");
    assert_eq!(proxy.connections(), 2, "one lost answer, one retry");
    let account = admin.account("acct-retry").await.unwrap();
    assert_eq!((account.available, account.reserved, account.active_leases), (90, 10, 1), "one lease granted");
    assert_eq!(
        server.gateway().lease(&lease.account_id, &lease.lease_id).await.unwrap().fencing_token,
        lease.fencing_token
    );

    // A release whose answer is lost is answered on retry, not refused as
    // `lease_not_active`.
    let proxy = LosingProxy::start(server.address, 1).await;
    let capability = lease.capability.as_deref().expect("a capability");
    let released =
        proxy.client(4).release(&lease.account_id, &lease.lease_id, capability).await.expect("the retry answers");
    assert_eq!((released.returned, proxy.connections()), (10, 2));
    let account = admin.account("acct-retry").await.unwrap();
    assert_eq!((account.available, account.reserved, account.active_leases), (100, 0, 0));
}

#[tokio::test]
async fn retries_stop_at_the_configured_attempts() {
    let server = Server::start(&Storage::Memory).await;
    let admin = crate::support::client(&server.url(), Some(ADMIN_TOKEN));
    Tenant::create(&admin, "acct-bound", 100).await;

    let proxy = LosingProxy::start(server.address, u32::MAX).await;
    let error = proxy.client(3).acquire("acct-bound", 10, LEASE_TTL).await.expect_err("every answer is lost");
    assert_eq!((error.kind, error.retryable), (ClientErrorKind::Transport, true));
    assert_eq!(proxy.connections(), 3, "exactly the configured attempts");
    let account = admin.account("acct-bound").await.unwrap();
    assert_eq!((account.reserved, account.active_leases), (10, 1), "three attempts, one effect");
}

/// A peer that answers with an endless body: the client stops reading at
/// `RESPONSE_BYTES_MAX` with a typed error instead of buffering it all.
#[tokio::test]
async fn an_answer_longer_than_the_limit_is_refused_while_reading() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let address = listener.local_addr().unwrap();
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = written.clone();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let _ = read_message(&mut stream).await;
        let body_bytes = 4 * tollgate_client::RESPONSE_BYTES_MAX;
        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {body_bytes}\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b' '; 64 * 1024];
        while stream.write_all(&chunk).await.is_ok() {
            counted.fetch_add(chunk.len(), Ordering::SeqCst);
        }
    });
    let client = crate::support::client(&format!("http://{address}"), Some(GATEWAY_TOKEN));
    let error = client.healthz().await.expect_err("the answer is too long");
    assert_eq!(
        (error.kind, error.code.as_str(), error.status),
        (ClientErrorKind::InvalidResponse, "invalid_response", Some(200))
    );
    assert!(error.message.contains("longer than"), "{error}");
    assert!(written.load(Ordering::SeqCst) < 4 * tollgate_client::RESPONSE_BYTES_MAX);
}
