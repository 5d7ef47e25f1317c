//! A webhook receiver on loopback that records every request, answers with
//! a status the test sets, and checks signatures with its own HMAC-SHA256
//! (written here from RFC 2104 over `sha2`, independent of the server's).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub signature: String,
    pub event_id: String,
    pub delivery_id: String,
    pub attempt: u32,
    pub body: Vec<u8>,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a webhook body is JSON")
    }
}

#[derive(Clone, Default)]
struct Shared {
    received: Arc<Mutex<Vec<Received>>>,
    status: Arc<AtomicU16>,
}

/// A receiver listening on `127.0.0.1` at a free port.
pub struct Receiver {
    address: SocketAddr,
    shared: Shared,
    task: JoinHandle<()>,
}

impl Receiver {
    /// Starts a receiver that answers 200 until told otherwise.
    pub async fn start() -> Receiver {
        let shared = Shared::default();
        shared.status.store(200, Ordering::SeqCst);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        let address = listener.local_addr().expect("an address");
        let app = axum::Router::new().route("/hook", post(record)).with_state(shared.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the receiver serves");
        });
        Receiver { address, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.address)
    }

    /// The status every later request gets.
    pub fn answer(&self, status: u16) {
        self.shared.status.store(status, Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().expect("not poisoned").clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    shared.received.lock().expect("not poisoned").push(Received {
        signature: header("tollgate-signature"),
        event_id: header("tollgate-event-id"),
        delivery_id: header("tollgate-delivery-id"),
        attempt: header("tollgate-delivery-attempt").parse().unwrap_or(0),
        body: body.to_vec(),
    });
    StatusCode::from_u16(shared.status.load(Ordering::SeqCst)).expect("a valid status")
}

/// HMAC-SHA256 per RFC 2104, with a 64-byte block.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new().chain_update(block.map(|b| b ^ 0x36)).chain_update(message).finalize();
    Sha256::new().chain_update(block.map(|b| b ^ 0x5c)).chain_update(inner).finalize().into()
}

/// Whether `received` carries a `v1` signature by `secret` over
/// `"<t>.<body>"`, with `t` the header's timestamp; returns that timestamp.
pub fn signed_by(received: &Received, secret: &str) -> Option<i64> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in received.signature.split(',') {
        match part.split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", hex)) => signatures.push(hex.to_owned()),
            _ => {}
        }
    }
    let timestamp = timestamp?;
    let mut message = format!("{timestamp}.").into_bytes();
    message.extend_from_slice(&received.body);
    let expected: String = hmac_sha256(secret.as_bytes(), &message).iter().map(|b| format!("{b:02x}")).collect();
    signatures.contains(&expected).then_some(timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_independent_hmac_matches_rfc_4231() {
        let hex = |mac: [u8; 32]| mac.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
